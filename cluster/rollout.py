"""Deploying the Baton app to Serve and waiting until it serves.

`serve.run` blocks until every replica is up, which for vLLM engines takes
a minute or more, so it runs in a thread while `rollout` polls Serve's
status and shows it through a `Progress` wait line. `baton up` and
`baton deploy` both deploy through here.
"""

from __future__ import annotations

import threading

from common.constants import APP_NAME
from common.progress import Progress


class Rollout:
    """One `serve.run` of the app in a background thread, and its status."""

    def __init__(self, app, blocking: bool = True):
        self.app = app
        self.blocking = blocking
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from ray import serve

        try:
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


def rollout(app, progress: Progress, timeout_s: float, wait: bool = True) -> None:
    """Deploys `app` as the Serve application and waits, showing progress.

    Returns once it is RUNNING (or, with wait=False, once Serve accepted it);
    raises RuntimeError if it failed and TimeoutError after `timeout_s`.
    """
    r = Rollout(app, blocking=wait)
    r.start()
    progress.wait("warming engines", r.poll, timeout_s)
