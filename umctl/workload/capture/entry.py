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
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import CaptureError


def split_entry(spec: str) -> tuple[str, str]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name or not name.isidentifier():
        raise CaptureError(f"entry {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION (e.g. "
                           "examples/torch/gpt2_step.py:make_step)")
    return where, name


def load_entry(spec: str) -> Callable:
    """The function ``spec`` names; a one-line CaptureError for a missing file or module, an
    import that fails, or a name that is not a function in it. A file's folder stays on
    ``sys.path`` only while importing it: :func:`entry_scope` keeps it there for a capture."""
    with entry_scope(spec) as fn:
        return fn


@contextmanager
def entry_scope(spec: str) -> Iterator[Callable]:
    """:func:`load_entry`'s function, with the file's folder on ``sys.path`` until the block ends
    (make_step and step may import the file's neighbours as late as they like, as ``python3
    file.py`` allows)."""
    where, name = split_entry(spec)
    folder = None
    if where.endswith(".py") or os.sep in where or "/" in where:
        if not os.path.isfile(where):
            raise CaptureError(f"{where}: no such file")
        mod_name = "_umctl_entry_" + os.path.splitext(os.path.basename(where))[0].replace("-", "_")
        loader_spec = importlib.util.spec_from_file_location(mod_name, where)
        if loader_spec is None or loader_spec.loader is None:
            raise CaptureError(f"{where}: not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        folder = os.path.dirname(os.path.abspath(where))
        if folder in sys.path:
            folder = None
        else:   # the file's own imports of its neighbours (as `python3 file.py` allows)
            sys.path.insert(0, folder)
        try:
            # registered before it runs, as an import does: dataclasses (and pickling, typing's
            # string annotations) look the module up in sys.modules while it executes
            previous = sys.modules.get(mod_name)
            sys.modules[mod_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException as e:
                if previous is not None:
                    sys.modules[mod_name] = previous
                else:
                    sys.modules.pop(mod_name, None)
                if isinstance(e, CaptureError):
                    raise
                raise CaptureError(f"{where}: importing it failed: {type(e).__name__}: {_one_line(e)}") from None
            yield _function(module, where, name)
        finally:
            if folder is not None and folder in sys.path:
                sys.path.remove(folder)
        return
    try:
        module = importlib.import_module(where)
    except ModuleNotFoundError as e:
        raise CaptureError(f"{where}: no such module ({_one_line(e)})") from None
    except BaseException as e:
        raise CaptureError(f"{where}: importing it failed: {type(e).__name__}: {_one_line(e)}") from None
    yield _function(module, where, name)


def _function(module, where: str, name: str) -> Callable:
    fn = getattr(module, name, None)
    if fn is None:
        raise CaptureError(f"{where}: has no function {name!r}")
    if not callable(fn):
        raise CaptureError(f"{where}: {name} is not a function")
    return fn


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
