"""Time the Run:ai model streamer reading one safetensors file from S3 (a peer for remote reads).

What it measures: for each of --runs runs, the wall time of a whole streamer session --
SafetensorsStreamer() start, stream_file("s3://B/K") (header reads, then the tensor data in
parallel ranged GETs), iterating get_tensors() until every tensor is in CPU memory (torch
tensors the caller owns), and the session's shutdown. Prints one JSON line:

    {"runai_s": [seconds per run...], "bytes": tensor bytes per run, "version": "<streamer version>"}

Its environment is a venv of its own (the streamer needs torch, which treecask's does not):

    python3 -m venv /work/bench-venv-runai
    /work/bench-venv-runai/bin/pip install torch==2.13.0          # the CPU wheel
    /work/bench-venv-runai/bin/pip install runai-model-streamer runai-model-streamer-s3 \
        safetensors numpy obstore

Run it with that venv's python, with the store's credentials in the environment:

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1 \
    /work/bench-venv-runai/bin/python bench/remote_runai.py \
        --endpoint http://127.0.0.1:PORT --bucket B --key model.safetensors --runs 5

--endpoint sets what the streamer's S3 client (the AWS C++ SDK) needs for an S3-compatible
server: AWS_ENDPOINT_URL (http:// is honoured as plain HTTP), RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0
(path-style requests) and AWS_EC2_METADATA_DISABLED=true (no IMDS probe). Concurrency and
chunk size are the streamer's defaults for object storage unless RUNAI_STREAMER_CONCURRENCY /
RUNAI_STREAMER_CHUNK_BYTESIZE are set.
"""

import argparse
import importlib.metadata
import json
import os
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoint", required=True, help="S3 endpoint URL, e.g. http://127.0.0.1:8333")
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    # Before the import: the C++ library reads these when its S3 client is made.
    os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    os.environ["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    from runai_model_streamer import SafetensorsStreamer

    url = f"s3://{args.bucket}/{args.key}"
    times, nbytes = [], None
    for _ in range(args.runs):
        got = 0
        t0 = time.perf_counter()
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(url)
            for _name, tensor in streamer.get_tensors():
                got += tensor.numel() * tensor.element_size()
        times.append(time.perf_counter() - t0)
        if nbytes is not None and got != nbytes:
            raise SystemExit(f"run read {got} bytes, an earlier one {nbytes}")
        nbytes = got
    print(json.dumps({"runai_s": times, "bytes": nbytes,
                      "version": importlib.metadata.version("runai-model-streamer")}))


if __name__ == "__main__":
    main()
