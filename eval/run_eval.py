"""Evaluate checkpoints with lm-eval and compare them (same as ``hfcompress eval``).

    python eval/run_eval.py out/none/checkpoint-500 out/sdp4bit/checkpoint-500 \
        --tasks mmlu,gsm8k --num-fewshot 5 --output results.csv

Offline (no hub): the default tasks arith_mmlu, arith_mmlu_cont, arith_gsm8k run on data
shipped with hfcompress.
"""

import sys

from hfcompress.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
