"""A real server in poll mode over a repository whose versions hold files of any type: a FIFO
where the model card, the default labels.json, the recorded check or a masked LM's tokenizer.json
belongs (reading one would block for good: before, the poller waited on the load forever, and the
tokenizer library froze the whole server while it held the GIL), and a sparse 400 MiB card or a
tokenizer.json over its bound (before, read whole). Each such version is listed UNAVAILABLE with a
reason naming the file, while the server keeps answering, the serving version of the same model
keeps serving, the poller loads a model deployed afterwards, and the server stops cleanly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from contract.limits import MAX_TOKENIZER_BYTES
from support.broken_dirs import BROKEN, copy_export, release_readers, special_file
from support.repository_servers import (
    add_version,
    start_repository_server,
    triton_http,
    version_reasons,
    version_states,
    versioned_repository,
)

pytestmark = pytest.mark.timeout(240)

VISION_CASES = ["card a FIFO", "default labels a FIFO", "check a FIFO", "card of 400 MiB", "labels of 5 MiB"]
FIFO = "a FIFO, not a regular file"


def test_poll_mode_lists_special_and_oversized_files_and_keeps_serving(
    start_server: Any,
    tmp_path: Path,
    tiny_vision_served: Path,
    tiny_mlm_served: Path,
    cifar_images: list[bytes],
) -> None:
    repo = versioned_repository(tmp_path / "models", {"tiny-vision": {1: tiny_vision_served}})
    server = start_repository_server(
        start_server, model_repository=repo, model_control="poll", repository_poll_s=0.1
    )
    for case in VISION_CASES:
        BROKEN[case][0](repo, tiny_vision_served)
    special_file("tokenizer.json", "fifo-tokenizer")(repo, tiny_mlm_served)
    special_file("tokenizer.json", "big-tokenizer", size=MAX_TOKENIZER_BYTES + 1)(repo, tiny_mlm_served)
    # Version 2 of the serving model, deployed the atomic way with a FIFO for its card.
    staging = copy_export(tiny_vision_served, repo / ".tiny-vision-2.partial")
    os.mkfifo(staging / "README.md")
    staging.rename(repo / "tiny-vision" / "2")
    fifos = [p for p in repo.rglob("*") if p.is_fifo()]
    expected = {
        ("fifo-card", "README.md", FIFO),
        ("fifo-labels", "labels.json", FIFO),
        ("fifo-check", "check.npz", FIFO),
        ("fifo-tokenizer", "tokenizer.json", FIFO),
        ("big-card", "README.md", "419,430,400 bytes, larger than its bound of 1,048,576 bytes"),
        ("big-labels", "labels.json", "larger than its bound of 4,194,304 bytes"),
        ("big-tokenizer", "tokenizer.json", f"larger than its bound of {MAX_TOKENIZER_BYTES:,} bytes"),
    }

    def listed() -> bool:
        return all(
            file in reason and words in reason
            for model, file, words in expected
            for reason in [version_reasons(server, model).get("1", "")]
        )

    try:
        server.wait_for(listed, 60)
        http = triton_http(server)
        server.wait_for(lambda: version_states(http, "tiny-vision").get("2") == "UNAVAILABLE", 30)
        assert FIFO in version_reasons(server, "tiny-vision")["2"]
        assert version_states(http, "tiny-vision")["1"] == "READY"  # still serving

        add_version(repo, "fresh", 1, tiny_mlm_served)  # deployed afterwards: the poller goes on
        server.wait_for(lambda: version_states(http, "fresh") == {"1": "READY"}, 60)
        with server.client() as client:
            assert client.get("/health/live").status_code == 200
            assert client.post("/classify", content=cifar_images[0]).status_code == 200
            filled = client.post("/fill-mask", json={"text": "the [MASK] sat.", "model": "fresh"})
            assert filled.status_code == 200, filled.text
        assert server.metric("gmlp_repository_poller_restarts_total") == 0
        server.stop()  # drains and stops: no thread is left waiting on a FIFO
    finally:
        release_readers(fifos)
