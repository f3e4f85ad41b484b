"""The one table of default thresholds: ``(warn, fail)`` per metric and dtype class.

Why these numbers: the error a correct lower-precision run shows grows with the unit
round-off ``u`` of its dtype (fp32 6e-8, fp16 4.9e-4, bf16 3.9e-3, fp8 e4m3 6.3e-2) and
with depth. SmolLM2-135M in bf16 against fp32 reaches a relative euclidean distance of
0.033 (about 8u) and a cosine of 0.9995 in its worst layer, so bf16 warns at about 4u and
fails at about 25u. fp32 against fp32 on other kernels (another device, a compiled graph)
differs by reduction order only, 1e-6 to 1e-5 after thirty layers, so fp32 warns at 1e-5
and fails at 1e-4: a wrong epsilon or a weight a few percent off is far above that.
Integer and boolean tensors (token ids, masks) must match exactly. Metrics not listed here
are reported and never decide a verdict. ``llmcheck compare --thresholds FILE`` overrides
any entry per name pattern.
"""

from __future__ import annotations

#: metric -> dtype class -> (warn, fail); "worse" is lower for cosine, higher for the others.
DEFAULT_THRESHOLDS: dict[str, dict[str, tuple[float, float]]] = {
    "cosine_similarity": {
        "fp64": (1 - 1e-12, 1 - 1e-10),
        "fp32": (1 - 1e-7, 1 - 1e-6),
        "fp16": (0.99999, 0.9999),
        "bf16": (0.9999, 0.995),
        "fp8": (0.999, 0.95),
    },
    "relative_euclidean_distance": {
        "fp64": (1e-10, 1e-8),
        "fp32": (1e-5, 1e-4),
        "fp16": (2e-3, 1.2e-2),
        "bf16": (1.6e-2, 0.1),
        "fp8": (0.1, 0.3),
    },
    "max_absolute_error": {
        "int": (0.0, 0.0),
        "bool": (0.0, 0.0),
    },
}
