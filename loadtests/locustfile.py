"""Locust workload for the gMLP service: /classify with CIFAR-10 test JPEGs, /fill-mask with real sentences.

    locust -f loadtests/locustfile.py --headless -u 16 -r 16 -t 30s --host http://127.0.0.1:8000

Configured by `GMLP_LOADTEST_*` environment variables (docs/loadtesting.md, `LoadConfig`). Users
are closed-loop (no think time by default): N users keep N requests in flight, which is what a
concurrency sweep measures.

Every answer is checked (status 200, keys, types, top_k entries, sorted probabilities, one list
per [MASK]); a wrong answer is a locust failure, never a success that merely looks fast.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

# locust puts this file's folder on sys.path, not the repository root that holds the package.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from locust import FastHttpUser, TaskSet, constant, events  # noqa: E402
from locust.env import Environment  # noqa: E402

from contract.errors import UserError  # noqa: E402
from contract.formats import MLM_TASK, VISION_TASK  # noqa: E402
from loadtests.engine import PreparedRequest, answer_error, task_requests  # noqa: E402
from loadtests.runner import get_json  # noqa: E402
from loadtests.workload import LoadConfig  # noqa: E402

log = logging.getLogger("gmlp.loadtest")

CONFIG = LoadConfig.from_env()
REQUESTS: dict[str, list[PreparedRequest]] = {}


@events.test_start.add_listener
def _fit_to_server(environment: Environment, **_: Any) -> None:
    """Ask GET /models which models serve each task and the MLM's window; prepare the requests of
    the tasks served (`loadtests.engine.task_requests`), drop the others.

    A sentence longer than the window would be a correct 422, counted as a failure; a server
    without a masked LM (a classifier-only deployment) should be load-tested on /classify alone.
    """
    REQUESTS.clear()  # a new run from the web UI prepares them again for what is served now
    try:
        listing = get_json(f"{(environment.host or '').rstrip('/')}/models")
    except (OSError, ValueError) as exc:  # URLError is an OSError
        log.warning("GET /models failed (%s): sending every task, GMLP_LOADTEST_MAX_TOKENS only", exc)
        listing = None
    models = {m["name"]: m for m in listing.get("models", [])} if listing else {}
    for task, func, named in (
        (VISION_TASK, classify, CONFIG.classify_model),
        (MLM_TASK, fill_mask, CONFIG.fill_mask_model),
    ):
        if func not in GmlpUser.tasks:
            continue
        served = named or (listing or {}).get("defaults", {}).get(task)
        try:
            if listing is not None and served not in models:
                if not named:
                    raise UserError(f"the server has no {task} model")
                # Asked for by name: keep sending, so that the 404s show up as failures.
                log.error("the server has no model %r (serves %s)", named, sorted(models))
            window = CONFIG.max_tokens or models.get(served, {}).get("n")
            REQUESTS[task] = task_requests(task, named, window, CONFIG)
        except UserError as exc:
            log.warning("%s: not sending %s", exc, task)
            GmlpUser.tasks = [t for t in GmlpUser.tasks if t is not func]
    if not GmlpUser.tasks:
        log.error("nothing to send: the server serves none of the weighted tasks; stopping")
        environment.process_exit_code = 2
        GmlpUser.tasks = [_idle]  # users spawn before the quit below takes effect
        if environment.runner is not None:
            import gevent

            gevent.spawn_later(0.1, environment.runner.quit)


def _idle(user: GmlpUser) -> None:
    import gevent

    gevent.sleep(1.0)


@events.test_stop.add_listener
def _let_csv_catch_up(environment: Environment, **_: Any) -> None:
    """Give locust's CSV writer (a greenlet rewriting PREFIX_stats.csv once a second) a last turn.

    Without it the CSV misses up to the last second of requests, and a failure in that second
    would not be in the report. The users are stopped by now, so the stats are final.
    """
    options = getattr(environment, "parsed_options", None)
    if options is not None and getattr(options, "csv_prefix", None):
        import gevent
        from locust.stats import CSV_STATS_INTERVAL_SEC

        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.25)


def _post(user: GmlpUser, task: str) -> None:
    """POST a random request of `task`; a failure unless a 200 whose JSON passes its check."""
    request = random.choice(REQUESTS[task])
    with user.client.post(
        request.path,
        # locust annotates `data` as str or dict; geventhttpclient sends bytes as they are.
        data=cast(Any, request.body),
        headers={"Content-Type": request.content_type},
        name=request.path.split("?")[0],
        catch_response=True,
    ) as response:
        if response.status_code:
            error = answer_error(request, response.status_code, response.content)
        else:  # no answer: locust's own reason (refused, reset, timed out)
            error = f"HTTP 0 {str(getattr(response, 'error', '') or '')[:120]}".strip()
        if error:
            response.failure(error[:300])
        else:
            response.success()


def classify(user: GmlpUser) -> None:
    """POST /classify with a random test JPEG, as a multipart upload or a raw image body."""
    _post(user, VISION_TASK)


def fill_mask(user: GmlpUser) -> None:
    """POST /fill-mask with a random held-out sentence that has one word masked."""
    _post(user, MLM_TASK)


class GmlpUser(FastHttpUser):
    """One closed-loop client: sends the next request as soon as (think time after) the last answered."""

    wait_time = constant(CONFIG.think_time_s)
    # Integer weights as repetitions (locust's own reading of a weight dict); weight 0: never picked.
    tasks: list[TaskSet | Callable[..., Any]] = [classify] * CONFIG.classify_weight
    tasks += [fill_mask] * CONFIG.fill_mask_weight
    network_timeout = 60.0
    connection_timeout = 10.0
