"""Training commands on tiny configs and real data: checkpoints, masking, evaluation.

Everything runs on the CPU in well under a minute: the models are 2 blocks wide 32, the data are
a few hundred CIFAR images and a few thousand Gutenberg sentences (decoded/tokenised into a
temporary cache, never the repository's). The training runs read the full data sets
(`shared_data` marker: skipped where there are none, see tests/data/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

TINY = ["--depth", "2", "--d-model", "32", "--d-ffn", "64", "--threads", "1"]


def _run(argv: list[str], capsys) -> dict:
    from gmlp.cli import main

    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def data(shared_data: Path) -> dict[str, Path]:
    """The full data sets as the training and evaluation commands take them."""
    return {
        "cifar": shared_data / "cifar10" / "cifar10-jpeg.npz",
        "corpus": shared_data / "gutenberg",
        "tokenizer": shared_data / "bert-base-uncased" / "tokenizer.json",
    }


def _data_args(data: dict[str, Path], *names: str) -> list[str]:
    flags = {"cifar": "--data", "corpus": "--corpus", "tokenizer": "--tokenizer"}
    return [arg for name in names for arg in (flags[name], str(data[name]))]


@pytest.fixture(scope="module")
def vision_ckpt(workdir: Path, data: dict[str, Path]) -> Path:
    from gmlp.cli import main

    out = workdir / "cifar"
    argv = [
        "train-vision",
        *_data_args(data, "cifar"),
        "--max-steps",
        "3",
        "--limit-train",
        "256",
        "--limit-eval",
        "200",
        "--batch-size",
        "32",
    ]
    argv += TINY + [
        "--out",
        str(out),
        "--state-dir",
        str(workdir / "vstate"),
        "--cache-dir",
        str(workdir / "cache"),
    ]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def mlm_ckpt(workdir: Path, data: dict[str, Path]) -> Path:
    from gmlp.cli import main

    out = workdir / "mlm"
    argv = ["train-mlm", *_data_args(data, "corpus", "tokenizer"), "--max-steps", "3"]
    argv += ["--limit-train", "2000", "--limit-valid-sentences", "1500"]
    argv += ["--eval-windows", "20", "--eval-short", "20", "--batch-size", "8", "--attn-dim", "8"]
    argv += ["--compile", *TINY]
    argv += ["--out", str(out), "--state-dir", str(workdir / "mstate"), "--cache-dir", str(workdir / "cache")]
    assert main(argv) == 0
    return out


@pytest.mark.shared_data
def test_train_vision_writes_loadable_checkpoint(vision_ckpt: Path) -> None:
    import torch

    from model import load_checkpoint
    from model.train.loop import native_bf16

    model = load_checkpoint(vision_ckpt)
    info = model.checkpoint_info
    assert info["task"] == "image-classification" and model.config.seq_len == 64
    assert json.loads((vision_ckpt / "labels.json").read_text())[:2] == ["airplane", "automobile"]
    assert info["preprocessing"]["crop_size"] == 32 and info["preprocessing"]["crop_pct"] == 1.0
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    training = json.loads((vision_ckpt / "training.json").read_text())
    assert training["steps"] == 3
    # --precision auto: bf16 autocast only on a CPU with native bf16, and the card says which.
    assert training["precision"] == ("bf16 autocast" if native_bf16() else "fp32")
    assert f"CPU thread(s), {training['precision']}" in (vision_ckpt / "README.md").read_text()
    assert 0.0 <= training["results"]["cifar10_test"]["top1"] <= 1.0
    card = (vision_ckpt / "README.md").read_text()
    assert "## Limitations" in card and '"top1"' in card


@pytest.mark.shared_data
def test_train_mlm_writes_loadable_checkpoint(mlm_ckpt: Path) -> None:
    import torch

    from model import load_checkpoint

    model = load_checkpoint(mlm_ckpt)
    assert model.checkpoint_info["task"] == "fill-mask" and model.config.n == 128
    assert model.config.attn_dim == 8  # aMLP: the tiny attention is trained and saved
    assert (mlm_ckpt / "tokenizer.json").is_file()
    logits = model(
        torch.full((1, 128), 0).index_fill_(1, torch.arange(3), 101), positions=torch.tensor([[1]])
    )
    assert logits.shape == (1, 1, model.config.vocab_size)
    card = (mlm_ckpt / "README.md").read_text()
    assert card.count("[MASK]") >= 10  # the ten fill-mask examples with their predictions
    assert "tiny attention of size 8" in card
    results = json.loads((mlm_ckpt / "training.json").read_text())["results"]["heldout_valid_000"]
    assert set(results) == {"full", "full_bert_masking", "short"}
    assert results["full"]["tokens"] == results["full_bert_masking"]["tokens"] > 0


@pytest.mark.parametrize(
    ("command", "flag"), [("train-vision", "--data"), ("train-mlm", "--corpus"), ("train-mlm", "--tokenizer")]
)
def test_training_without_data_says_which_flag_is_missing(
    command: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Without GMLP_SHARED_DATA the data sets are not looked for anywhere: the command asks for them."""
    from gmlp.cli import main

    monkeypatch.delenv("GMLP_SHARED_DATA", raising=False)
    given = ["--corpus", str(tmp_path)] if flag == "--tokenizer" else []
    assert main([command, *given, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"no data: pass {flag} " in err and "GMLP_SHARED_DATA" in err
    assert not (tmp_path / "out").exists()


def test_random_erase_covers_the_documented_area() -> None:
    from model.train.data import CIFAR_MEAN, random_erase

    images = np.full((400, 32, 32, 3), 255, dtype=np.uint8)
    out = random_erase(images, np.random.default_rng(0), prob=0.5)
    erased = (out != 255).any(-1)  # [N, 32, 32] pixels overwritten
    hit = erased.any((1, 2))
    assert 0.4 < hit.mean() < 0.6
    area = erased[hit].mean((1, 2))
    assert area.min() >= 0.01 and area.max() <= 0.35  # 2-25% of the image, up to rounding
    assert (out[hit][erased[hit]] == np.rint(np.asarray(CIFAR_MEAN) * 255)).all()
    assert (images == 255).all()  # the input is left alone


@pytest.mark.shared_data
def test_resume_continues_from_saved_step(
    vision_ckpt: Path, workdir: Path, data: dict[str, Path], capsys
) -> None:
    state = workdir / "vstate" / "train_state.pt"
    assert state.is_file()
    argv = [
        "train-vision",
        *_data_args(data, "cifar"),
        "--max-steps",
        "5",
        "--limit-train",
        "256",
        "--limit-eval",
        "50",
        "--batch-size",
        "32",
    ]
    argv += TINY + ["--out", str(workdir / "cifar-resumed"), "--state-dir", str(workdir / "vstate")]
    argv += ["--cache-dir", str(workdir / "cache"), "--resume"]
    _run(argv, capsys)
    assert json.loads((workdir / "cifar-resumed" / "training.json").read_text())["steps"] == 5


@pytest.mark.shared_data
def test_bert_masking_statistics_on_real_text(workdir: Path, data: dict[str, Path]) -> None:
    from model.train.data import SpecialIds, full_window, load_corpus, mask_tokens, short_window

    special = SpecialIds.from_tokenizer(data["tokenizer"])
    corpus = load_corpus(
        [data["corpus"] / "valid-000.txt.gz"], data["tokenizer"], workdir / "cache", max_sentences=1500
    )
    short = corpus.short_sentences()
    assert len(short) > 100
    rows = [full_window(corpus, i, 128, special) for i in range(0, 600, 2)]
    rows += [short_window(corpus, int(i), 128, special) for i in short[:300]]
    ids = np.stack(rows)
    rng = np.random.default_rng(0)
    selected = replaced_mask = replaced_other = kept = candidates = 0
    for _ in range(5):
        corrupted, positions, labels = mask_tokens(ids, rng, special, max_predictions=20)
        used = labels >= 0
        rows_idx = np.nonzero(used)[0]
        pos = positions[used]
        original = ids[rows_idx, pos]
        assert (labels[used] == original).all()
        assert not np.isin(original, [special.cls, special.sep, special.pad]).any()
        # specials are never touched, and nothing outside the selected positions changes
        changed = corrupted != ids
        assert not changed[np.isin(ids, [special.cls, special.sep, special.pad])].any()
        assert changed.sum() <= used.sum()
        new = corrupted[rows_idx, pos]
        replaced_mask += int((new == special.mask).sum())
        kept += int((new == original).sum())
        replaced_other += int(((new != special.mask) & (new != original)).sum())
        selected += int(used.sum())
        candidates += int(np.isin(ids, [special.cls, special.sep, special.pad], invert=True).sum())
        assert (used.sum(1) >= 1).all()
    assert 0.14 < selected / candidates < 0.17
    assert abs(replaced_mask / selected - 0.8) < 0.02
    assert abs(replaced_other / selected - 0.1) < 0.02
    assert abs(kept / selected - 0.1) < 0.02


def test_schedule_warmup_then_cosine_to_floor() -> None:
    from model.train.loop import StepPlanner, lr_at

    lrs = [lr_at(s, 100, 1e-3, 10, 0.01) for s in range(100)]
    assert lrs[0] < lrs[5] < lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:-1], lrs[10:], strict=True))
    assert lr_at(100, 100, 1e-3, 10, 0.01) == pytest.approx(1e-5)
    planner = StepPlanner(max_steps=7, budget_s=None)
    assert [planner.done(s) for s in (6, 7)] == [False, True]


class _RandomTokens:
    """A task of random windows with 5 decoded positions each, the same batch for the same step."""

    def __init__(self, vocab_size: int, n: int) -> None:
        self.vocab_size, self.n = vocab_size, n

    def make_batch(self, step: int):
        import torch

        gen = torch.Generator().manual_seed(step)
        ids = torch.randint(1, self.vocab_size, (4, self.n), generator=gen)
        return (
            ids,
            torch.randint(0, self.n, (4, 5), generator=gen),
            torch.randint(1, 999, (4, 5), generator=gen),
        )

    def loss(self, model, batch):
        import torch.nn.functional as F

        ids, positions, labels = batch
        logits = model(ids, positions=positions).float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten()), {}


def test_compiled_training_matches_eager() -> None:
    """`--compile` changes how the steps run, not what they compute: the same init trained for four
    fp32 steps on the same batches predicts the same logits either way, while the training itself
    moves the logits far more than the tolerance."""
    import torch

    from model import build_model
    from model.train.loop import LoopConfig, train_loop
    from support.helpers import tiny_mlm_config

    torch.manual_seed(0)
    config = tiny_mlm_config(attn_dim=8)
    init = build_model(config).state_dict()
    task = _RandomTokens(config.vocab_size, config.n)
    probe = task.make_batch(99)
    logits = {}
    for compiled in (False, True):
        model = build_model(config)
        model.load_state_dict(init)
        cfg = LoopConfig(
            lr=3e-3, weight_decay=0.01, warmup_steps=1, max_steps=4, bf16=False, compile=compiled
        )
        train_loop(model, task, cfg)
        with torch.no_grad():
            logits[compiled] = model(probe[0], positions=probe[1])
    model.load_state_dict(init)
    with torch.no_grad():
        before = model(probe[0], positions=probe[1])
    assert (logits[False] - before).abs().max() > 0.1
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-3, atol=1e-3)


@pytest.mark.shared_data
def test_eval_checkpoints(
    vision_ckpt: Path, mlm_ckpt: Path, workdir: Path, data: dict[str, Path], capsys
) -> None:
    cache = ["--cache-dir", str(workdir / "cache"), *_data_args(data, "cifar", "corpus")]
    vision = _run(["eval", str(vision_ckpt), "--limit", "200", *cache], capsys)
    assert vision["cifar10_test"]["images"] == 200 and 0.0 <= vision["cifar10_test"]["top1"] <= 1.0
    mlm = _run(["eval", str(mlm_ckpt), "--limit", "16", *cache], capsys)
    for part in ("full", "short"):
        scores = mlm["heldout_valid_000"][part]
        assert scores["tokens"] > 0 and 0.0 <= scores["top1"] <= scores["top5"] <= 1.0


@pytest.mark.shared_data
@pytest.mark.parametrize("kind", ["vision", "mlm"])
def test_eval_served_model_matches_checkpoint(
    kind: str, request, workdir: Path, data: dict[str, Path], capsys
) -> None:
    export = pytest.importorskip("export.directory")
    ckpt = request.getfixturevalue(f"{kind}_ckpt")
    served = workdir / f"{kind}-served"
    export.export_served_model(ckpt, served)
    cache = ["--cache-dir", str(workdir / "cache"), *_data_args(data, "cifar", "corpus")]
    onnx = _run(["eval", str(served), "--limit", "24", "--variant", "fp32", *cache], capsys)
    torch_run = _run(["eval", str(ckpt), "--limit", "24", *cache], capsys)
    assert onnx["runtime"] == "onnx" and torch_run["runtime"] == "pytorch"
    key = "cifar10_test" if kind == "vision" else "heldout_valid_000"
    # same data, same masking seed; tiny random models can flip a near-tie, so allow one miss
    if kind == "vision":
        assert abs(onnx[key]["top1"] - torch_run[key]["top1"]) <= 1 / 24 + 1e-9
    else:
        for part in ("full", "short"):
            assert onnx[key][part]["tokens"] == torch_run[key][part]["tokens"]
            assert (
                abs(onnx[key][part]["top5"] - torch_run[key][part]["top5"]) <= 2 / onnx[key][part]["tokens"]
            )


@pytest.mark.shared_data
def test_eval_record_puts_served_figures_in_the_card(
    mlm_ckpt: Path, workdir: Path, data: dict[str, Path], capsys
) -> None:
    import shutil

    export = pytest.importorskip("export.directory")
    from model.train.evaluate import fill_mask_examples, open_predictor

    ckpt = workdir / "mlm-recorded"
    shutil.copytree(mlm_ckpt, ckpt)
    served = workdir / "mlm-recorded-served"
    export.export_served_model(ckpt, served)
    argv = ["eval", str(served), "--limit", "16", "--variant", "fp32", "--record", str(ckpt)]
    line = _run(argv + ["--cache-dir", str(workdir / "cache"), *_data_args(data, "corpus")], capsys)
    recorded = json.loads((ckpt / "training.json").read_text())["served"]["fp32"]
    assert recorded["results"] == {"heldout_valid_000": line["heldout_valid_000"]}
    assert recorded["command"] == f"gmlp eval {served} --variant fp32 --limit 16"
    card = (ckpt / "README.md").read_text()
    assert "## Served model (exported ONNX)" in card and recorded["command"] in card
    assert "as the served fp32 ONNX model answers" in card
    # The served answers agree with the PyTorch checkpoint's, computed independently.
    reference = fill_mask_examples(open_predictor(ckpt))
    assert len(recorded["fill_mask_examples"]) == len(reference) == 10
    for onnx_ex, torch_ex in zip(recorded["fill_mask_examples"], reference, strict=True):
        for onnx_slot, torch_slot in zip(onnx_ex["predictions"], torch_ex["predictions"], strict=True):
            torch_probs = dict(torch_slot)
            shared = [(t, p) for t, p in onnx_slot if t in torch_probs]
            assert len(shared) >= 4
            assert all(abs(p - torch_probs[t]) <= 2e-3 for t, p in shared)
