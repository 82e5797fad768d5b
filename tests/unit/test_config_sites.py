"""`sites:` (common/config/sites.py, deployments/sites/site_link.check): errors name the field and the file."""

from __future__ import annotations

import pytest

from common.config import ConfigError, load_config
from deployments.sites.site_link import check
from tests.unit.test_config import write

PEERS = "  peers: [{name: b, url: 'http://127.0.0.1:9001'}]\n"


@pytest.mark.parametrize("text, field", [
    ("sites:\n" + PEERS, "sites: Value error, peers need this site's own name"),
    ("sites:\n  name: a\n  peers: [{name: a, url: 'http://x:1'}]\n", "peer names must be distinct"),
    ("sites:\n  name: a\n  peers: [{name: b, url: 'x:1/path'}]\n", "sites.peers.0.url"),
    ("sites:\n  name: A!\n", "sites.name"),
    ("sites:\n  name: a\n  probe_s: 2\n  map_ttl_s: 3\n", "map_ttl_s must be at least twice probe_s"),
    ("sites:\n  name: a\n  policy: nearest\n", "sites.policy"),
    ("sites:\n  name: a\n  busy_tau_s: 0\n", "sites.busy_tau_s"),
])
def test_bad_sites_config_is_named_with_the_file(tmp_path, text, field):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), environ={})
    assert field in str(err.value) and "baton.yaml" in str(err.value)


def test_peers_need_a_site_token_and_known_select_fields(tmp_path):
    cfg = load_config(write(tmp_path, "sites:\n  name: a\n" + PEERS), environ={})
    assert cfg.sites.enabled
    with pytest.raises(ConfigError, match=r"in f\.yaml:\n  sites\.token_file \(or \$BATON_SITE_TOKEN\)"):
        check(cfg, "f.yaml")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = load_config(write(tmp_path, f"sites:\n  name: a\n  token_file: {token}\n" + PEERS +
                            "  select: {near_k: 0}\n"), environ={})
    with pytest.raises(ConfigError, match=r"sites\.select: .*near_k"):
        check(cfg, "f.yaml")
    cfg = load_config(write(tmp_path, f"sites:\n  name: a\n  token_file: {token}\n" + PEERS +
                            "  select: {nearest: 1}\n"), environ={})
    with pytest.raises(ConfigError, match=r"sites\.select: .*nearest"):
        check(cfg, "f.yaml")
    cfg = load_config(write(tmp_path, f"sites:\n  name: a\n  token_file: {token}\n" + PEERS), environ={})
    check(cfg, "f.yaml")
    assert cfg.sites.token() == "s3cret"
