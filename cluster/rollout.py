"""Deploying the Baton app to Serve and waiting until it serves.

`serve.run` blocks until every replica is up, which for vLLM engines takes
a minute or more, so it runs in a thread while `rollout` polls Serve's
status and shows it through a `Progress` wait line. `baton up` and
`baton deploy` both deploy through here.

With an application-level autoscaling policy (prefill and decode scaled
together, deployments/autoscaling.AppForecastPolicy), the app goes through
Serve's config deploy instead: Serve 2.60 takes an application's
`autoscaling_policy` only there, not from `serve.run`. A config names its app
by import path, and Serve builds it in a task of its own; the graph the
deployer built (its config, environment and overrides) is stored in Ray's
GCS key-value store and `stashed_app`, the import path, loads it back, so both
ways deploy the same graph.
"""

from __future__ import annotations

import threading

from common.constants import APP_NAME, RAY_NAMESPACE
from common.progress import Progress

STASH_KEY = b"baton_app_graph"
STASHED_APP = "cluster.rollout:stashed_app"


def stash(app) -> None:
    """Stores `app` (a bound Serve Application) in the GCS key-value store, replacing the last."""
    from ray import cloudpickle
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(STASH_KEY, cloudpickle.dumps(app), overwrite=True, namespace=RAY_NAMESPACE)


def stashed_app(args: dict | None = None):
    """Serve's app builder for a config deploy: the graph `stash` stored. Changes nothing."""
    from ray import cloudpickle
    from ray.experimental import internal_kv

    blob = internal_kv._internal_kv_get(STASH_KEY, namespace=RAY_NAMESPACE)
    if blob is None:
        raise RuntimeError("no Baton app graph in the GCS key-value store (deploy with baton up or baton deploy)")
    return cloudpickle.loads(blob)


def config_deploy(app, app_policy: dict) -> None:
    """Deploys `app` through Serve's config path with `app_policy` as the application's
    autoscaling policy; returns once the controller took the config."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

    stash(app)
    spec = ServeApplicationSchema(name=APP_NAME, import_path=STASHED_APP, route_prefix=None,
                                  autoscaling_policy=app_policy)
    _get_global_client().deploy_apps(ServeDeploySchema(applications=[spec]))


class Rollout:
    """One `serve.run` of the app in a background thread, and its status."""

    def __init__(self, app, blocking: bool = True, app_policy: dict | None = None):
        self.app = app
        self.blocking = blocking
        self.app_policy = app_policy
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from ray import serve

        try:
            if self.app_policy is not None:
                config_deploy(self.app, self.app_policy)
            else:
                serve.run(self.app, name=APP_NAME, route_prefix=None, blocking=False)
        except BaseException as exc:  # noqa: BLE001 - reported by poll()
            self.error = exc

    def start(self) -> None:
        """Starts deploying; returns at once."""
        self.thread.start()

    def poll(self) -> tuple[bool, str]:
        """(done, what Serve says now). Done means RUNNING once `serve.run`
        returned, or, unless blocking, as soon as Serve knows the app.

        Raises RuntimeError when the deployment failed.
        """
        from ray import serve

        if self.error is not None:
            raise RuntimeError(f"Serve deployment failed: {self.error}")
        try:
            status = serve.status().applications.get(APP_NAME)
        except Exception as exc:  # noqa: BLE001 - controller still starting
            return False, f"waiting for Serve ({type(exc).__name__})"
        if status is None:
            return False, "deploying"
        state = status.status.value
        if state == "DEPLOY_FAILED":
            raise RuntimeError(f"Serve deployment failed: {status.message}")
        detail = ", ".join(f"{name} {d.status.value}" for name, d in status.deployments.items()) or state
        if not self.blocking and state in ("DEPLOYING", "RUNNING") and status.deployments:
            return True, detail
        return state == "RUNNING" and not self.thread.is_alive(), detail


def rollout(app, progress: Progress, timeout_s: float, wait: bool = True, app_policy: dict | None = None) -> None:
    """Deploys `app` as the Serve application and waits, showing progress; `app_policy`,
    an application-level autoscaling policy, makes it a config deploy.

    Returns once it is RUNNING (or, with wait=False, once Serve accepted it);
    raises RuntimeError if it failed and TimeoutError after `timeout_s`.
    """
    r = Rollout(app, blocking=wait, app_policy=app_policy)
    r.start()
    progress.wait("warming engines", r.poll, timeout_s)
