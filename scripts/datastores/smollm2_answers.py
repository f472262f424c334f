"""Build the shipped ``smollm2-135m-instruct-answers`` datastore (specprim/models/datastores/, see its README.md).

The text: SmolLM2-135M-Instruct's own greedy answers (bfloat16, packed, at most 256 new tokens) to 2,000 ShareGPT V3
first turns, positions 3,000-4,999 of the length-sorted list that ``scripts/smollm2_heads/prepare_data.py`` writes
(the shipped heads trained on positions 0-2,999; MT-bench is not in ShareGPT). Produce them, then build:

    mkdir RUN && cd RUN && python ../scripts/smollm2_heads/prepare_data.py --start 3000 --distilled 2000 \\
        --original 0 --dtype bfloat16 --batch-size 32          # ~45 min on 2 cores; writes distilled.jsonl
    python scripts/datastores/smollm2_answers.py RUN/distilled.jsonl \\
        specprim/models/datastores/smollm2-135m-instruct-answers
"""

import argparse
import json
from pathlib import Path

from specprim.drafters import Datastore
from specprim.models import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("conversations", type=Path, help="prepare_data.py's distilled.jsonl (one message list a line)")
    parser.add_argument("out", type=Path, help="the datastore directory to write datastore.npz into")
    args = parser.parse_args()
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    answers = [json.loads(line)[-1]["content"] for line in args.conversations.open()]
    store = Datastore.from_texts([a for a in answers if a], tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    store.save(args.out / "datastore.npz")
    print(f"{store!r} from {len(answers)} answers -> {args.out / 'datastore.npz'}")


if __name__ == "__main__":
    main()
