"""The KServe Python SDK's REST client (v2 protocol) against `mtgate serve`, unchanged: its health calls read the
JSON bodies of /v2/health/* and /v2/models/{name}/ready, and its infer call gets the /v1 translations.

The SDK lives in .venv-kserve (`make kserve-sdk`, which `make test` runs; its pins are not the server's), so the
client runs there, in a subprocess; where it could not be installed this test skips and says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.utils.server import ROOT, start_server

PYTHON = ROOT / ".venv-kserve" / "bin" / "python"

CLIENT = """
import asyncio, json, sys
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

async def main(url, model, texts):
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    health = [await client.is_server_live(url), await client.is_server_ready(url), await client.is_model_ready(url, model)]
    tensor = InferInput(name="INPUT_TEXT", shape=[len(texts), 1], datatype="BYTES", data=texts)
    result = await client.infer(url, InferRequest(model_name=model, infer_inputs=[tensor]), model_name=model)
    await client.close()
    print(json.dumps({"health": health, "outputs": {o.name: o.data for o in result.outputs}}))

asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
"""


def test_kserve_sdk_health_and_infer(tiny_package: Path) -> None:
    if not PYTHON.exists():
        pytest.skip("the KServe SDK is not installed (`make kserve-sdk` installs it into .venv-kserve)")
    server = start_server(tiny_package)
    try:
        texts = ["A man is riding a bike.", "Two dogs play in the snow."]
        v1 = httpx.post(server.url + "/v1/translate", json={"text": texts}, timeout=60).json()
        proc = subprocess.run([str(PYTHON), "-c", CLIENT, server.url, v1["model"], json.dumps(texts)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        assert answer["health"] == [True, True, True]
        assert answer["outputs"]["OUTPUT_TEXT"] == [t["text"] for t in v1["translations"]]
        assert answer["outputs"]["OUTPUT_TOKENS"] == [t["output_tokens"] for t in v1["translations"]]
    finally:
        assert server.stop() == 0, "".join(server.log)
