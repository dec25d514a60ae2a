"""Drive an exported model.py the way Triton's Python backend stub does, with the stand-in utils module.

Usage: ``python triton_driver.py MODEL_DIR VERSION`` with a JSON list of executions on stdin; each execution is a list
of requests ``{"texts": [[...], ...] | null, "parameters": {...}}`` (``texts`` null: the request lacks INPUT_TEXT).
Prints one JSON document: where ``serving`` was imported from, which of mtgate's packages were imported, and, per
execution, one result per request (``{"error": message}`` or ``{"outputs": {name: {"dtype", "shape", "data"}}}``).

It runs in its own process (as Triton runs each model in a stub process) so that model.py imports the engine it
bundles, not the one of the test process.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "triton_stub"))

import triton_python_backend_utils as pb_utils  # noqa: E402


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype == np.object_:
        return [[v.decode("utf-8") for v in row] for row in array.reshape(array.shape[0], -1)]
    return array.tolist()


def main() -> int:
    model_dir, version = Path(sys.argv[1]), sys.argv[2]
    executions = json.load(sys.stdin)
    spec = importlib.util.spec_from_file_location("model", model_dir / version / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = _config_as_json(model_dir / "config.pbtxt")
    model.initialize({
        "model_config": json.dumps(config),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{model_dir.name}_0",
        "model_instance_device_id": "0",
        "model_repository": str(model_dir),
        "model_version": version,
        "model_name": model_dir.name,
    })
    results = []
    for execution in executions:
        requests = []
        for item in execution:
            inputs = []
            if item.get("texts") is not None:
                array = np.array([[t.encode("utf-8") for t in row] for row in item["texts"]], dtype=np.object_)
                inputs.append(pb_utils.Tensor("INPUT_TEXT", array))
            requests.append(pb_utils.InferenceRequest(model_dir.name, inputs, [], item.get("parameters")))
        responses = model.execute(requests)
        assert len(responses) == len(requests), "execute must answer every request"
        out = []
        for response in responses:
            assert isinstance(response, pb_utils.InferenceResponse)
            if response.has_error():
                out.append({"error": response.error().message()})
            else:
                out.append({"outputs": {
                    t.name(): {"dtype": str(t.as_numpy().dtype), "shape": list(t.as_numpy().shape),
                               "data": _jsonable(t.as_numpy())}
                    for t in response.output_tensors()
                }})
        results.append(out)
    model.finalize()
    serving = sys.modules["serving"]
    mtgate = sorted({name.split(".")[0] for name in sys.modules} & {"serving", "converters", "batch", "loadtest"})
    json.dump({"serving_file": serving.__file__, "mtgate_packages": mtgate, "results": results}, sys.stdout)
    return 0


def _config_as_json(path: Path) -> dict[str, Any]:
    """What Triton passes as ``args["model_config"]``: the ModelConfig as JSON (protobuf's JSON mapping)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


if __name__ == "__main__":
    sys.exit(main())
