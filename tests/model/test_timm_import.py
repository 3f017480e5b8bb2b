"""timm gMLP checkpoints -> our checkpoint format (`gmlp convert-timm`)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from safetensors.torch import save_file

from gmlp.cli import main as gmlp
from model import build_model, get_config, load_checkpoint
from support.helpers import perturbed

# Written out here (not imported from model.timm_import) so the test checks the mapping against
# timm's own key names (timm/models/mlp_mixer.py: stem.proj, blocks.N.mlp_channels.{fc1,gate,fc2}).
OURS_TO_TIMM = [
    (r"^patch_embed\.proj\.", "stem.proj."),
    (r"^blocks\.(\d+)\.proj_in\.", r"blocks.\1.mlp_channels.fc1."),
    (r"^blocks\.(\d+)\.sgu\.norm\.", r"blocks.\1.mlp_channels.gate.norm."),
    (r"^blocks\.(\d+)\.sgu\.spatial_proj\.", r"blocks.\1.mlp_channels.gate.proj."),
    (r"^blocks\.(\d+)\.proj_out\.", r"blocks.\1.mlp_channels.fc2."),
]


def as_timm_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in model.state_dict().items():
        for pattern, repl in OURS_TO_TIMM:
            key = re.sub(pattern, repl, key)
        out[key] = value.clone()
    return out


@pytest.fixture(scope="module")
def ti_model():
    torch.manual_seed(0)
    return perturbed(build_model(get_config("gmlp_ti16_224")))


@pytest.mark.parametrize("suffix", [".pth", ".pth.tar", ".safetensors"])
def test_convert_timm_cli_round_trip(tmp_path, ti_model, suffix):
    state = as_timm_state_dict(ti_model)
    assert len(state) == 2 + 30 * 10 + 4  # timm's gmlp_ti16_224 has 306 keys, as gmlp_s16_224
    source = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        save_file(state, source)
    elif suffix == ".pth.tar":
        torch.save({"state_dict": state, "epoch": 3}, source)  # a training checkpoint wrapper
    else:
        torch.save(state, source)
    assert gmlp(["convert-timm", str(source), "--arch", "gmlp_ti16_224", "--out", str(tmp_path / "out")]) == 0
    converted = load_checkpoint(tmp_path / "out")
    info = converted.checkpoint_info
    assert info["preprocessing"]["crop_pct"] == 0.875 and info["preprocessing"]["interpolation"] == "bicubic"
    labels = (tmp_path / "out" / "labels.json").read_text()
    assert "tench" in labels  # ImageNet labels, the package's own, by default
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), ti_model(x), rtol=0, atol=0)


def test_convert_timm_missing_key_is_named(tmp_path, ti_model, capsys):
    state = as_timm_state_dict(ti_model)
    del state["blocks.7.mlp_channels.gate.proj.weight"]
    torch.save(state, tmp_path / "w.pth")
    assert (
        gmlp(
            ["convert-timm", str(tmp_path / "w.pth"), "--arch", "gmlp_ti16_224", "--out", str(tmp_path / "o")]
        )
        == 1
    )
    assert "missing key 'blocks.7.sgu.spatial_proj.weight'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_convert_timm_wrong_arch_names_shapes(tmp_path, ti_model, capsys):
    torch.save(as_timm_state_dict(ti_model), tmp_path / "w.pth")
    assert (
        gmlp(
            ["convert-timm", str(tmp_path / "w.pth"), "--arch", "gmlp_s16_224", "--out", str(tmp_path / "o")]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "patch_embed.proj.weight' has shape (128, 3, 16, 16), the model expects (256, 3, 16, 16)" in err


def test_convert_timm_refuses_pickled_objects(tmp_path, capsys):
    import argparse

    # torch.save pickles any object; an arbitrary class must not be unpickled when converting.
    torch.save({"head.weight": argparse.Namespace(payload="not a tensor")}, tmp_path / "evil.pth")
    assert gmlp(["convert-timm", str(tmp_path / "evil.pth"), "--out", str(tmp_path / "o")]) == 1
    assert "weights-only" in capsys.readouterr().err


def test_convert_timm_not_a_gmlp(tmp_path, capsys):
    save_file({"fc.weight": torch.zeros(2, 2)}, tmp_path / "resnet.safetensors")
    assert gmlp(["convert-timm", str(tmp_path / "resnet.safetensors"), "--out", str(tmp_path / "o")]) == 1
    assert "missing key 'head.weight'" in capsys.readouterr().err


@pytest.mark.timm
@pytest.mark.skipif(
    importlib.util.find_spec("timm") is None,
    reason="timm is not installed (it needs torchvision, which imports only beside torch 2.14.1; "
    "see docs/development.md: `make timm-parity`)",
)
@pytest.mark.parametrize("arch", ["gmlp_ti16_224", "gmlp_s16_224"])
def test_parity_with_timm(tmp_path, arch):
    """Independent computation: timm's own gMLP with random weights vs ours with the converted weights."""
    import timm

    torch.manual_seed(0)
    reference = timm.create_model(arch, pretrained=False).eval()
    with torch.no_grad():  # move W and the head off their init so every part of the model matters
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    torch.save(reference.state_dict(), tmp_path / "timm.pth")
    assert (
        gmlp(["convert-timm", str(tmp_path / "timm.pth"), "--arch", arch, "--out", str(tmp_path / "ours")])
        == 0
    )
    ours = load_checkpoint(tmp_path / "ours")
    x = torch.randn(4, 3, 224, 224)
    with torch.no_grad():
        diff = (ours(x) - reference(x)).abs().max().item()
    print(f"timm parity {arch}: max |logit diff| = {diff:.3e}")
    assert diff <= 1e-4
