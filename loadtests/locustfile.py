"""Locust workload for the gMLP service: /classify with CIFAR-10 test JPEGs, /fill-mask with real sentences.

    locust -f loadtests/locustfile.py --headless -u 16 -r 16 -t 30s --host http://127.0.0.1:8000

Configured by environment variables (see docs/loadtesting.md and `LoadConfig`), the main ones:
GMLP_LOADTEST_CLASSIFY_WEIGHT / GMLP_LOADTEST_FILL_MASK_WEIGHT (task weights, default 1 and 1),
GMLP_LOADTEST_CIFAR (npz), GMLP_LOADTEST_TEXT (text or .gz), GMLP_LOADTEST_UPLOAD
(multipart|raw|mixed). Users are closed-loop (no think time by default): N users keep N requests
in flight, which is what a concurrency sweep measures.

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

from contract.formats import MLM_TASK, VISION_TASK  # noqa: E402
from loadtests.engine import PreparedRequest, answer_error, classify_request, fill_mask_request  # noqa: E402
from loadtests.metrics_scrape import get_json  # noqa: E402
from loadtests.workload import (  # noqa: E402
    LoadConfig,
    MaskedSentence,
    fitting,
    load_images,
    load_sentences,
)

log = logging.getLogger("gmlp.loadtest")

CONFIG = LoadConfig.from_env()
IMAGES: list[bytes] = []
SENTENCES: list[MaskedSentence] = []
REQUESTS: dict[str, list[PreparedRequest]] = {}


@events.init.add_listener
def _load_inputs(environment: Environment, **_: Any) -> None:
    """Load the inputs once per locust process, before any user starts."""
    global IMAGES, SENTENCES
    if CONFIG.classify_weight:
        IMAGES, source = load_images(CONFIG.cifar_path)
        log.info("classify: %d JPEGs from %s", len(IMAGES), source)
    if CONFIG.fill_mask_weight:
        SENTENCES, source = load_sentences(CONFIG)
        log.info("fill-mask: %d masked sentences from %s", len(SENTENCES), source)


@events.test_start.add_listener
def _fit_to_server(environment: Environment, **_: Any) -> None:
    """Ask GET /models which models serve each task and the MLM's window; drop tasks nobody serves.

    A sentence longer than the window would be a correct 422, counted as a failure; a server
    without a masked LM (a classifier-only deployment) should be load-tested on /classify alone.
    """
    global SENTENCES
    REQUESTS.clear()  # a new run from the web UI prepares them again for what fits now
    try:
        listing = get_json(f"{(environment.host or '').rstrip('/')}/models")
    except (OSError, ValueError) as exc:  # URLError is an OSError
        log.warning("GET /models failed (%s): sending every task, GMLP_LOADTEST_MAX_TOKENS only", exc)
        SENTENCES = fitting(SENTENCES, CONFIG.max_tokens)
        return
    models = {m["name"]: m for m in listing.get("models", [])}
    defaults = listing.get("defaults", {})
    served = {
        VISION_TASK: CONFIG.classify_model or defaults.get(VISION_TASK),
        MLM_TASK: CONFIG.fill_mask_model or defaults.get(MLM_TASK),
    }
    explicit = {VISION_TASK: CONFIG.classify_model, MLM_TASK: CONFIG.fill_mask_model}
    for task, func in ((VISION_TASK, classify), (MLM_TASK, fill_mask)):
        if func not in GmlpUser.tasks or served[task] in models:
            continue
        if explicit[task]:
            # Asked for by name: keep sending, so that the 404s show up as failures.
            log.error("the server has no model %r (serves %s)", explicit[task], sorted(models))
            continue
        log.warning("the server has no %s model: not sending that task", task)
        GmlpUser.tasks = [t for t in GmlpUser.tasks if t is not func]
    if fill_mask in GmlpUser.tasks and served[MLM_TASK] in models:
        max_tokens = CONFIG.max_tokens or models[served[MLM_TASK]].get("n")
        SENTENCES = fitting(SENTENCES, max_tokens)
        log.info("fill-mask: %d sentences fit the %s-token window", len(SENTENCES), max_tokens)
        if not SENTENCES:
            log.error("no sentence fits %s tokens: not sending fill-mask", max_tokens)
            GmlpUser.tasks = [t for t in GmlpUser.tasks if t is not fill_mask]
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


def _requests(task: str) -> list[PreparedRequest]:
    """The task's requests, prepared on first use (after `_fit_to_server` kept what fits):
    `GMLP_LOADTEST_UPLOAD=mixed` holds both forms of each image, so each request picks one."""
    if task == VISION_TASK and task not in REQUESTS:
        uploads = {"multipart": (True,), "raw": (False,), "mixed": (True, False)}[CONFIG.upload]
        REQUESTS[task] = [
            classify_request(image, CONFIG.top_k, model=CONFIG.classify_model, multipart=multipart)
            for image in IMAGES
            for multipart in uploads
        ]
    elif task not in REQUESTS:
        model = CONFIG.fill_mask_model
        REQUESTS[task] = [fill_mask_request(s.text, CONFIG.top_k, model=model) for s in SENTENCES]
    return REQUESTS[task]


def _post(user: GmlpUser, task: str) -> None:
    """POST a random request of `task`; a failure unless a 200 whose JSON passes its check."""
    request = random.choice(_requests(task))
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
