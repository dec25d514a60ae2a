"""``--precision auto``, every command's default: int8 where the package's manifest shows that it costs at most 1 BLEU
(or, without BLEU, that it agrees with fp32 on at least 95% of next tokens), fp32 otherwise
(``serving.package.choose_precision``); an explicit precision is kept; what was chosen is what the model reports."""

from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from serving.commands.main import main
from serving.engine.translator import Translator
from serving.package import choose_precision, read_manifest, write_manifest
from serving.package.precision import INT8_MAX_BLEU_DROP, INT8_MIN_AGREEMENT
from serving.server.settings import DEFAULT_MODEL_DIR, ServingSettings


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    if not (DEFAULT_MODEL_DIR / "manifest.json").is_file():
        pytest.fail(f"the demo package is not built ({DEFAULT_MODEL_DIR}): run `make demo` (make test does)")
    return read_manifest(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def fp32_only(demo: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo package with its onnxruntime fp32 artifact only (what `convert --precisions fp32` writes)."""
    root = tmp_path_factory.mktemp("fp32-only")
    manifest = copy.deepcopy(demo)
    manifest["artifacts"] = [a for a in demo["artifacts"] if (a["runtime"], a["precision"]) == ("onnxruntime", "fp32")]
    for rel in {*demo["tokenizer"]["files"].values(), *manifest["artifacts"][0]["files"].values()}:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DEFAULT_MODEL_DIR / rel, root / rel)
    write_manifest(root, manifest)
    return root


def _scores(manifest: dict[str, Any], runtime: str) -> list[dict[str, Any]]:
    return [s for s in manifest["quality"]["scores"] if s["runtime"] == runtime]


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_the_demo_gets_int8_by_its_bleu(demo: dict[str, Any], runtime: str) -> None:
    choice = choose_precision(demo, runtime)
    assert choice.precision == "int8"
    assert f"int8 BLEU within {INT8_MAX_BLEU_DROP:g} of fp32 on 3 test set(s)" in choice.reason


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_an_int8_that_loses_bleu_on_one_test_set_is_not_chosen(demo: dict[str, Any], runtime: str) -> None:
    manifest = copy.deepcopy(demo)
    fp32 = {s["testset"]: s["bleu"] for s in _scores(manifest, runtime) if s["precision"] == "fp32"}
    worse = next(s for s in _scores(manifest, runtime) if s["precision"] == "int8")
    worse["bleu"] = fp32[worse["testset"]] - INT8_MAX_BLEU_DROP - 0.01
    choice = choose_precision(manifest, runtime)
    assert choice.precision == "fp32" and "more than 1 below fp32" in choice.reason
    worse["bleu"] = fp32[worse["testset"]] - INT8_MAX_BLEU_DROP  # the bound itself still goes
    assert choose_precision(manifest, runtime).precision == "int8"


def test_no_int8_artifact_gives_fp32_and_no_fp32_gives_int8(demo: dict[str, Any]) -> None:
    manifest = copy.deepcopy(demo)
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["precision"] == "fp32"]
    choice = choose_precision(manifest, "onnxruntime")
    assert (choice.precision, choice.reason) == ("fp32", "the package has no onnxruntime/int8 artifact")
    manifest = copy.deepcopy(demo)
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["precision"] == "int8"]
    assert choose_precision(manifest, "openvino").precision == "int8"


def test_without_bleu_the_parity_record_decides(demo: dict[str, Any]) -> None:
    manifest = copy.deepcopy(demo)
    del manifest["quality"]
    row = manifest["parity"]["onnxruntime/int8"]
    assert row["next_token_agreement"] >= INT8_MIN_AGREEMENT  # the demo's: 0.995
    choice = choose_precision(manifest, "onnxruntime")
    assert choice.precision == "int8" and "next-token agreement with fp32 0.995 >= 0.95" in choice.reason
    row["next_token_agreement"] = 0.93  # passed conversion's 0.9 floor, not the stricter bound of auto
    assert choose_precision(manifest, "onnxruntime").precision == "fp32"
    del manifest["parity"]["onnxruntime/int8"]  # converted with --no-verify
    choice = choose_precision(manifest, "onnxruntime")
    assert choice.precision == "fp32" and "not verified" in choice.reason
    manifest["quality"] = {"scores": _scores(demo, "openvino")}  # BLEU of another runtime says nothing here
    assert choose_precision(manifest, "onnxruntime").precision == "fp32"
    assert choose_precision(manifest, "openvino").precision == "int8"


def test_an_int8_that_failed_its_parity_check_is_not_chosen(demo: dict[str, Any]) -> None:
    manifest = copy.deepcopy(demo)
    manifest["parity"]["openvino/int8"]["passed"] = False
    choice = choose_precision(manifest, "openvino")
    assert (choice.precision, choice.reason) == ("fp32", "int8 failed its parity check at conversion")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_an_explicit_precision_is_kept(demo: dict[str, Any], precision: str) -> None:
    manifest = copy.deepcopy(demo)
    del manifest["quality"], manifest["parity"]["onnxruntime/int8"]
    assert choose_precision(manifest, "onnxruntime", precision).precision == precision


def test_the_engine_loads_the_choice_and_reports_it(fp32_only: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="serving.engine.translator")  # the engine says it at DEBUG (a server names versions)
    assert Translator.load(DEFAULT_MODEL_DIR, precision="auto", threads=1).info.precision == "int8"
    assert Translator.load(DEFAULT_MODEL_DIR, precision="fp32", threads=1).info.precision == "fp32"
    assert Translator.load(fp32_only, precision="auto", threads=1).info.precision == "fp32"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert "(onnxruntime/int8: int8 BLEU within 1 of fp32" in lines[0]
    assert "(onnxruntime/fp32: asked for)" in lines[1]
    assert "(onnxruntime/fp32: the package has no onnxruntime/int8 artifact)" in lines[2]


def test_commands_default_to_auto_and_say_why(capsys: pytest.CaptureFixture[str],
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="serving.engine.translator")  # the engine says it at DEBUG (a server names versions)
    assert ServingSettings().precision == "auto"
    assert main(["translate", "-m", str(DEFAULT_MODEL_DIR), "--threads", "1", "A dog runs."]) == 0
    assert main(["translate", "-m", str(DEFAULT_MODEL_DIR), "--threads", "1", "--precision", "fp32", "A dog."]) == 0
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert "onnxruntime/int8: int8 BLEU within" in loaded[0] and "onnxruntime/fp32: asked for" in loaded[1]
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_the_server_reports_the_precision_it_chose() -> None:
    from fastapi.testclient import TestClient

    from serving.server.http import create_app
    from tests.serving.server.conftest import wait_ready

    app = create_app(ServingSettings(model_dirs=[DEFAULT_MODEL_DIR], threads=1, warmup=False))
    with TestClient(app) as client:
        wait_ready(client, timeout=60)
        model = client.get("/v1/models/demo-en-de").json()
    assert (model["runtime"], model["precision"]) == ("onnxruntime", "int8")
