"""lm-evaluation-harness on a multiple-choice task written to disk: ``local-completions``
against this site's ``/v1/completions`` beside lm_eval's HF transformers backend on the
same weights, in one run. Prints each one's accuracy and wall time, and their ratio.

    python -m benchmarks.bench_lm_eval [--model DIR] [--docs N]

Without ``--model`` a tiny random Llama (SmolLM2's tokenizer) is built in a temporary
directory; any HF model directory the engine loads works (HF loads the same directory).
The accuracies must be equal: the script exits 1 if they differ.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path


def setup_django(db_path: Path) -> None:
    os.environ["SQLITE_PATH"] = str(db_path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # this script's ORM calls are set-up only
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="an HF model directory (default: a tiny random Llama)")
    parser.add_argument("--docs", type=int, default=40, help="questions in the task (4 choices each)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-lm-eval-"))
    if args.model:
        model_dir = Path(args.model)
    else:
        from tests.support.fakes import make_tiny_model_dir

        model_dir = make_tiny_model_dir(work / "tiny-llama", arch="llama")
    setup_django(work / "db.sqlite3")
    from django.contrib.auth import get_user_model

    from conversations.models import ApiKey
    from tests.live_site import health_details, start_live_site, stop_live_site
    from tests.support.lm_eval_task import api_model_args, hf_model_args, run_lm_eval, write_task

    user = get_user_model().objects.create_user(f"bench-{uuid.uuid4().hex[:8]}", password="a-long-pass-42")
    _, key = ApiKey.objects.create_key(user, "bench")
    os.environ["OPENAI_API_KEY"] = key
    task_dir = write_task(work / "task", num_docs=args.docs)
    site = start_live_site(model_dir, work, API_RATE_LIMIT_PER_MINUTE="0")
    try:
        name = health_details(site.url)["engine"]["model"]
        ours = run_lm_eval(task_dir, "local-completions", api_model_args(f"{site.url}/v1", name, model_dir))
    finally:
        stop_live_site(site)
    hf = run_lm_eval(task_dir, "hf", hf_model_args(model_dir))
    worst = max(
        abs(a - b)
        for mine, theirs in zip(ours.loglikelihoods, hf.loglikelihoods, strict=True)
        for a, b in zip(mine, theirs, strict=True)
    )
    requests = sum(len(choices) for choices in ours.loglikelihoods)
    print(f"task: {args.docs} questions, {requests} log-likelihood requests; model {model_dir}")
    print(f"{'backend':<34} {'accuracy':>9} {'seconds':>9}")
    print(f"{'lm_eval local-completions (/v1)':<34} {ours.accuracy:>9.4f} {ours.seconds:>9.2f}")
    print(f"{'lm_eval hf (transformers, fp32)':<34} {hf.accuracy:>9.4f} {hf.seconds:>9.2f}")
    print(f"time /v1 / hf: {ours.seconds / hf.seconds:.2f}x; largest log-likelihood difference {worst:.2e}")
    if ours.accuracy != hf.accuracy:
        print("MISMATCH: the accuracies differ", file=sys.stderr)
        return 1
    print("accuracies agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
