"""An image's cost is bounded by what the server would make of it, decided from its header.

A line of pixels (a 65000x1 PNG is a few hundred bytes, far below the decoded-pixel limit) would be
resized to the model's resize size on its shorter side, tens of millions of pixels, before the
crop. Every door an image comes through (/classify, the Hugging Face API, the v2 `image` input)
refuses it with 413 in its API's shape; the peak memory of the real server process (`gmlp serve`,
read from /proc) stays within a bound while several such images arrive at once.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from gmlp.server_process import ServerProcess, gmlp_serve

pytestmark = pytest.mark.timeout(240)

MiB = 1024 * 1024
# Growth of the server's peak resident memory allowed while the hostile images are refused. One of
# them resized as it comes would take hundreds of MiB (65000 x 32 x 32 pixels of RGB, and more).
PEAK_GROWTH_BOUND = 64 * MiB


def encoded(size: tuple[int, int], fmt: str = "PNG", mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, fmt)
    return buf.getvalue()


HOSTILE = {
    "line": encoded((65000, 1)),
    "column": encoded((1, 65000)),
    "grey-line": encoded((65000, 1), mode="L"),
    "gif-line": encoded((65000, 1), "GIF", "L"),
    "jpeg-strip": encoded((40000, 8), "JPEG"),
}


def peak_rss(pid: int) -> int:
    """VmHWM of the process: the most resident memory it has ever had, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def v2_image_request(image: bytes) -> dict[str, Any]:
    """The v2 `image` input as binary tensor data (JSON header, then the BYTES element)."""
    element = len(image).to_bytes(4, "little") + image
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(element)},
                }
            ]
        }
    ).encode()
    return {"content": head + element, "headers": {"Inference-Header-Content-Length": str(len(head))}}


def rest_error(body: Any) -> str:
    return f"{body['error']['code']}: {body['error']['message']}"


def message_error(body: Any) -> str:
    return str(body["error"])


# Each door: its path, how an image is sent there, how its error body is read.
DOORS: dict[str, tuple[str, Callable[[bytes], dict[str, Any]], Callable[[Any], str]]] = {
    "classify": ("/classify", lambda image: {"content": image}, rest_error),
    "hugging-face": ("/models/tiny-vision", lambda image: {"content": image}, message_error),
    "v2-image": ("/v2/models/tiny-vision/infer", v2_image_request, message_error),
}


def send(client: httpx.Client, door: str, image: bytes) -> tuple[int, str]:
    path, request, error = DOORS[door]
    response = client.post(path, **request(image))
    return response.status_code, error(response.json()) if response.status_code != 200 else ""


def serve(repository: Path, tmp_path_factory: pytest.TempPathFactory, *flags: str) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("image-budget") / "server.log"
    with gmlp_serve(repository, log_path=log, serve_args=["--intra-op-threads", "1", *flags]) as process:
        yield process


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serve(repository, tmp_path_factory)


@pytest.fixture
def fresh_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own: its peak memory is that of this test's images only. It decodes one
    image of 36 million pixels at a time, and gives a request time for several in turn."""
    yield from serve(
        repository, tmp_path_factory, "--max-decoding-pixels", str(36_000_000), "--request-timeout-s", "180"
    )


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_door_refuses_an_elongated_image_with_the_reason(
    server: ServerProcess, door: str, name: str
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        status, error = send(client, door, HOSTILE[name])
    assert status == 413, error
    assert "before the centre crop" in error and "max_resized_pixels" in error and ":1" in error
    if door == "classify":
        assert error.startswith("image_too_large: ")


def test_hostile_images_at_once_stay_within_a_memory_bound(
    server: ServerProcess, cifar_images: list[bytes]
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for door in DOORS:  # ordinary images first: what every request allocates is in the baseline
            assert send(client, door, cifar_images[0])[0] == 200
    baseline = peak_rss(server.pid)
    work = [(door, image) for door in DOORS for image in HOSTILE.values()] * 2
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=server.base_url, timeout=60) as client:
        statuses = list(pool.map(lambda item: send(client, *item)[0], work))
    growth = peak_rss(server.pid) - baseline
    assert growth < PEAK_GROWTH_BOUND, f"peak memory grew by {growth / MiB:.0f} MiB"
    assert statuses == [413] * len(work)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:  # and ordinary images still work
        assert all(send(client, door, cifar_images[1])[0] == 200 for door in DOORS)


# What a decoded image may cost per pixel at its peak: its decoded form (up to 4 bytes a pixel in
# Pillow) and the RGB image made of it (4), and bands of intermediates. Converted whole, a 16-bit
# greyscale image took over 20 bytes a pixel (floating point) and a transparent one about 15.
BYTES_PER_PIXEL_BOUND = 10
SIDE = 6000  # 36 million pixels, within the decoded-pixel limit; each file is under 150 KB


def test_deep_and_transparent_images_cost_about_what_an_rgb_one_does(
    fresh_server: ServerProcess, cifar_images: list[bytes]
) -> None:
    side = SIDE
    images = [encoded((side, side), mode=mode) for mode in ("I;16", "RGBA", "LA", "RGB")]
    with httpx.Client(base_url=fresh_server.base_url, timeout=120) as client:
        assert send(client, "classify", cifar_images[0])[0] == 200
        baseline = peak_rss(fresh_server.pid)
        for image in images:
            assert send(client, "classify", image)[0] == 200
    growth = peak_rss(fresh_server.pid) - baseline
    assert growth < BYTES_PER_PIXEL_BOUND * side * side, f"peak memory grew by {growth / MiB:.0f} MiB"


def test_the_rows_of_one_request_decode_within_the_process_budget(
    fresh_server: ServerProcess, cifar_images: list[bytes]
) -> None:
    """Six large transparent PNGs in one v2 request (under 1 MB in all) would decode side by side
    in the worker threads; within `max_decoding_pixels` (one of them here) they decode in turn,
    and the peak is that of one."""
    image = encoded((SIDE, SIDE), mode="RGBA")
    rows = 6
    element = len(image).to_bytes(4, "little") + image
    tensor = {"name": "image", "datatype": "BYTES", "shape": [rows, 1]}
    head = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": rows * len(element)}}]})
    with httpx.Client(base_url=fresh_server.base_url, timeout=240) as client:
        assert send(client, "v2-image", cifar_images[0])[0] == 200
        baseline = peak_rss(fresh_server.pid)
        response = client.post(
            "/v2/models/tiny-vision/infer",
            content=head.encode() + element * rows,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [rows, 10]
    growth = peak_rss(fresh_server.pid) - baseline
    assert growth < BYTES_PER_PIXEL_BOUND * SIDE * SIDE, f"peak memory grew by {growth / MiB:.0f} MiB"
