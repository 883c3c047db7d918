"""The user's entry point: ``path/to/file.py:make_step`` or ``package.module:make_step``.

The contract (docs/guide/advise.md)::

    def make_step(batch: int, device: torch.device):
        model = ...build on `device`...
        opt = torch.optim.AdamW(model.parameters())
        def step():
            x = torch.randint(0, vocab, (batch, seq), device=device)
            loss = model(x).loss
            loss.backward(); opt.step(); opt.zero_grad()
        return model, step          # or just `step`

``make_step`` builds everything one training (or inference) step needs and returns the step;
the model is optional and only names the parameters in the report. Under ``umctl capture`` the
device is ``meta`` and every tensor made while ``make_step`` runs defaults to it, so nothing of
the model's size is allocated; on a GPU the same function runs with ``cuda``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable

from .errors import CaptureError


def split_entry(spec: str) -> tuple[str, str]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name or not name.isidentifier():
        raise CaptureError(f"entry {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION (e.g. "
                           "examples/torch/gpt2_step.py:make_step)")
    return where, name


def load_entry(spec: str) -> Callable:
    """The function ``spec`` names; a one-line CaptureError for a missing file or module, an
    import that fails, or a name that is not a function in it."""
    where, name = split_entry(spec)
    if where.endswith(".py") or os.sep in where or "/" in where:
        if not os.path.isfile(where):
            raise CaptureError(f"{where}: no such file")
        mod_name = "_umctl_entry_" + os.path.splitext(os.path.basename(where))[0].replace("-", "_")
        loader_spec = importlib.util.spec_from_file_location(mod_name, where)
        if loader_spec is None or loader_spec.loader is None:
            raise CaptureError(f"{where}: not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        folder = os.path.dirname(os.path.abspath(where))
        added = folder not in sys.path
        if added:   # the file's own imports of its neighbours (as `python3 file.py` allows)
            sys.path.insert(0, folder)
        try:
            loader_spec.loader.exec_module(module)
        except CaptureError:
            raise
        except BaseException as e:
            raise CaptureError(f"{where}: importing it failed: {type(e).__name__}: {_one_line(e)}") from None
        finally:
            if added:
                sys.path.remove(folder)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise CaptureError(f"{where}: no such module ({_one_line(e)})") from None
        except BaseException as e:
            raise CaptureError(f"{where}: importing it failed: {type(e).__name__}: {_one_line(e)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise CaptureError(f"{where}: has no function {name!r}")
    if not callable(fn):
        raise CaptureError(f"{where}: {name} is not a function")
    return fn


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
