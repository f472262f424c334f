"""The llama.cpp side of the ``llama-cpp`` benchmark baselines, run as its own process.

It imports ``llama_cpp`` and never torch (the two crash in one process on some builds). Protocol: one JSON object
per line on stdin, ``{"ids": [...], "max_new_tokens": n, "eos": [...]}``; one reply per line on stdout,
``{"new_ids": [...], "seconds": s}`` (greedy decoding, timed around generation only) or ``{"error": "..."}``.
A first line ``{"ready": true}`` is written once the model is loaded.

    python -m specprim.bench._llama_worker MODEL.gguf --threads 2 [--prompt-lookup K]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--prompt-lookup", type=int, default=0, help="draft tokens of llama.cpp's prompt lookup")
    args = parser.parse_args()
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=args.prompt_lookup) if args.prompt_lookup else None
    # use_extra_bufts=False: multi-token batches crash in the AMX repacked matmul of some CPU builds.
    model = llama_cpp.Llama(model_path=args.gguf, n_ctx=args.context, n_threads=args.threads, draft_model=draft,
                            use_extra_bufts=False, verbose=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            stop = set(request["eos"])
            new_ids: list[int] = []
            start = time.perf_counter()
            for token in model.generate(request["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                        reset=True):
                new_ids.append(int(token))
                if token in stop or len(new_ids) >= request["max_new_tokens"]:
                    break
            reply = {"new_ids": new_ids, "seconds": time.perf_counter() - start}
        except Exception as error:  # reported to the parent, which raises it there
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
