"""Reading the model repository: both layouts side by side, complete and incomplete version
directories, version policies in every accepted form, and the refusals of unreadable ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contract.repository import PolicyError, VersionPolicy, policy_from_config
from contract.scan import fingerprint, require_sources, scan
from contract.spec import SpecError


@pytest.mark.parametrize(
    ("text", "available", "selected"),
    [
        ("latest:1", [1, 2, 3], {3}),
        ("latest:2", [1, 3, 2], {2, 3}),
        ("latest:5", [1, 2], {1, 2}),
        ("all", [1, 4], {1, 4}),
        ("specific:1,3", [1, 2, 3], {1, 3}),
        ("specific:4", [1, 2], set()),
    ],
)
def test_policies_select_versions(text: str, available: list[int], selected: set[int]) -> None:
    policy = VersionPolicy.parse(text)
    assert policy.select(available) == selected
    assert VersionPolicy.parse(policy.triton()) == policy and str(policy) == text


@pytest.mark.parametrize(
    "bad", ["newest", "latest:0", "latest:x", "specific:", "specific:0", "all:2", 3, {"a": 1}]
)
def test_unreadable_policies_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(PolicyError, match="latest:N") as refused:
        VersionPolicy.parse(bad)
    if isinstance(bad, str):  # the form echoed as it was given
        assert str(refused.value).startswith(f"version policy {bad!r}:")


def test_a_load_config_carries_the_policy_in_tritons_form() -> None:
    config = json.dumps({"name": "m", "version_policy": {"specific": {"versions": [2, 1]}}})
    assert policy_from_config(config) == VersionPolicy("specific", 1, (1, 2))
    assert policy_from_config("{}") is None
    with pytest.raises(PolicyError, match="JSON object"):
        policy_from_config("[1]")


def test_both_layouts_and_incomplete_versions(
    tmp_path: Path, tiny_vision_served: Path, tiny_mlm_served: Path
) -> None:
    repo = tmp_path / "models"
    shutil.copytree(tiny_mlm_served, repo / "flat-dir")  # flat: named by its config
    shutil.copytree(tiny_vision_served, repo / "vision" / "1")
    (repo / "vision" / "2").mkdir()  # being copied: no config.json yet
    shutil.copyfile(tiny_vision_served / "model.onnx", repo / "vision" / "2" / "model.onnx")
    shutil.copytree(tiny_vision_served, repo / "vision" / "3")
    (repo / "vision" / "3" / "labels.json").unlink()  # config.json written, a file it names missing
    (repo / "vision" / "policy.json").write_text('{"version_policy": "all"}')
    (repo / ".staging").mkdir()
    models = scan(repo)
    assert list(models) == ["tiny-mlm", "vision"]
    assert list(models["tiny-mlm"].versions) == [1] and models["tiny-mlm"].complete_versions() == [1]
    vision = models["vision"]
    assert vision.policy == VersionPolicy("all") and vision.complete_versions() == [1]
    assert "no config.json yet" in (vision.versions[2].problem or "")
    assert "labels.json" in (vision.versions[3].problem or "")
    assert vision.versions[1].spec is not None and vision.versions[1].spec.name == "vision"
    before = fingerprint(repo / "vision" / "1")
    (repo / "vision" / "1" / "README.md").write_text("retrained")
    assert fingerprint(repo / "vision" / "1") != before


def test_repositories_that_cannot_be_served(tmp_path: Path, tiny_vision_served: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        scan(tmp_path / "missing")
    (tmp_path / "empty" / "m" / "1").mkdir(parents=True)
    with pytest.raises(SpecError, match="no served models.*no config.json yet"):
        require_sources(tmp_path / "empty")
    shutil.copytree(tiny_vision_served, tmp_path / "two" / "tiny-vision" / "1")
    shutil.copytree(tiny_vision_served, tmp_path / "two" / "copy")  # flat, also named tiny-vision
    (both,) = scan(tmp_path / "two").values()  # neither is chosen silently: the model is held
    assert both.versions == {} and "2 directories claim the model name 'tiny-vision'" in (both.problem or "")
    (tmp_path / "two" / "tiny-vision" / "policy.json").write_text("latest:2")
    shutil.rmtree(tmp_path / "two" / "copy")
    (held,) = scan(tmp_path / "two").values()
    assert held.complete_versions() == [1] and "policy.json" in (held.problem or "")


def test_a_repository_read_once_must_serve_every_model(tmp_path: Path, tiny_vision_served: Path) -> None:
    """Model control none (`every_model`): a version that cannot be served refuses the repository,
    naming it; what the scan only ignored beside the versions (a stray directory) does not."""
    repo = tmp_path / "models"
    shutil.copytree(tiny_vision_served, repo / "vision" / "1")
    (repo / "vision" / "old").mkdir()
    assert "old" in " ".join(repo_notes := scan(repo)["vision"].problems()), repo_notes
    assert list(require_sources(repo, every_model=True)) == ["vision"]
    shutil.copytree(tiny_vision_served, repo / "vision" / "2")
    (repo / "vision" / "2" / "labels.json").unlink()
    assert list(require_sources(repo)) == ["vision"]  # watched modes: version 2 listed UNAVAILABLE
    with pytest.raises(SpecError, match="cannot be served: model vision version 2: .*labels.json"):
        require_sources(repo, every_model=True)
