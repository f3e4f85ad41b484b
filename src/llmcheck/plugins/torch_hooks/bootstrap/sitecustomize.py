"""Put first on ``PYTHONPATH`` by ``llmcheck dump --backend torch``: turns capture on in this process.

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that holds
one. This one stays cheap -- it does not import torch -- and only arms a hook that sets up
capture right after the program imports torch. A ``sitecustomize`` the environment already
had is run afterwards, so it keeps working. A failure here is reported in one line and the
program runs on without capture, never broken by it.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _arm_capture():
    if not os.environ.get("LLMCHECK_TORCH_CAPTURE"):
        return
    try:
        import llmcheck  # noqa: F401
    except ImportError:
        parent = os.environ.get("LLMCHECK_PACKAGE_PARENT")
        if parent:
            sys.path.append(parent)  # last, so the program's own packages win
    try:
        from llmcheck.plugins.torch_hooks.autocapture import arm

        arm()
    except Exception as exc:  # the user's program must still run
        sys.stderr.write(f"llmcheck: error: cannot start torch capture in {sys.executable}: {exc}\n")


def _run_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    search = [entry for entry in sys.path if os.path.abspath(entry or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_arm_capture()
_run_shadowed_sitecustomize()
