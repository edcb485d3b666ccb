"""Forty-second review of issue 15: the lead's findings (rows the reviewers left open).

2. ``LocalTrainer(task).load_global(v)`` (the public method that loads a global model for
   evaluation) with ``v`` of the layout's length and dtype but on the meta device or sparse.
   Before: torch's ``NotImplementedError`` ("Cannot copy out of meta tensor; no data!", "Could
   not run 'aten::as_strided' ... 'SparseCPU'"), where ``train`` refuses the same with a
   ``ValueError`` since the api reviewer's fix 7. Now: ``ValueError`` naming ``global_flat``
   (``ModelLayout.load_global``).
3. The Python API ``simulate(config, "A/plots/api")`` with ``A`` a finished run (the processes
   reviewer's open row; ``fedprivopt simulate --out A/plots/api`` refuses it). Before: rc 0, a
   whole run written among ``A``'s files. Now: ``ValueError`` naming ``out_dir`` and ``A``, before
   anything is written (``simulation.run_places.refuse_inside_a_run``, which ``deploy.out_checks``
   re-exports; a directory beside ``A`` still runs).
6. A task factory of one's own whose code raises ``TypeError`` (a bug in it), ``simulate`` from
   the command line (the docs reviewer's open row). Before: a traceback, rc 1 (docs/TASKS.md
   promises one line and rc 2 for a task's exceptions; a factory's ``OSError`` or ``ValueError``
   and a ``TypeError`` of ``build_model`` were one line). Now: rc 2, one line naming the task,
   the exception, the factory's file and line (``cli_task_errors._raised_in_factory``).
7. ``compare-tuned T --out R`` over its own earlier report, stopped (Ctrl-C) between two of the
   removals of that report (the ledger follow-up's open row). Before: ``report.md`` went second,
   so a stop after it left the plots alone, and the same command was refused ("holds
   'metric_vs_round.png', which compare-tuned did not write"). Now ``report.md``, which tells the
   report as compare-tuned's, is removed last (``cli_compare_tuned._write_whole_report``).
8. The public ``clip_l2(v, 1.0)`` (the privacy follow-up's open row; issue 15's point 5: every
   public clipping function returns a norm at most C) of a ``torch.Tensor`` subclass whose own
   ``__torch_function__`` reports norm 0, or of a plain tensor whose instance carries its own
   ``detach``. Before: both returned unclipped (norm 1000 where C = 1, ``clipped`` False). Now:
   the subclass is refused (``ValueError``), the other is measured and scaled through
   ``torch.Tensor.detach`` (norm at most C); a ``Parameter`` or a tensor that requires grad is
   clipped as before, its result still in the autograd graph.
9. The deployment ServerApp (``flwr run`` without ``deploy local``) with run config
   ``out = "A/plots/sub"``, ``A`` a finished run, and with ``out = "~nosuchuser/x"`` (the outputs
   follow-up's open rows). Before: a run written among ``A``'s files; pathlib's ``RuntimeError``
   after the SuperLink and SuperNodes had started. Now: ``ValueError`` naming ``out`` before the
   run directory is made (``deploy.server_app.run_deployment``, ``deploy.runconfig.check_run_out``,
   which ``deploy_local`` calls before anything starts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprivopt.cli import main
from fedprivopt.clients.trainer import LocalTrainer
from fedprivopt.models import build_task
from fedprivopt.simulation.config import load_config
from fedprivopt.simulation.run import simulate

TOY = Path(__file__).resolve().parents[2] / "simulations" / "toy.toml"


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_2_load_global_of_a_tensor_without_values_names_the_argument(kind):
    trainer = LocalTrainer(build_task("toy", num_users=4, seed=0))
    n = trainer.spec.numel
    flat = torch.zeros(n, device="meta") if kind == "meta" else torch.zeros(n).to_sparse()
    with pytest.raises(ValueError, match="global_flat must be a dense tensor with values"):
        trainer.load_global(flat)
    model = trainer.load_global(torch.zeros(n))  # a dense one still loads
    assert all(float(p.detach().abs().sum()) == 0.0 for p in model.parameters())


def test_3_the_python_simulate_refuses_an_out_dir_inside_a_run(tmp_path):
    config = load_config(TOY, {"num-server-rounds": 1})
    simulate(config, tmp_path / "A")
    with pytest.raises(ValueError, match=r"argument out_dir: .*/A/plots/api is inside the run"):
        simulate(config, tmp_path / "A" / "plots" / "api")
    assert not (tmp_path / "A" / "plots").exists()
    assert simulate(config, tmp_path / "B").rows  # beside it, a run as before


def test_6_a_factory_whose_code_raises_type_error_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "bugfactory42.py").write_text(
        "def make(num_users=4, seed=0):\n    raise TypeError('inner bug of the factory')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["simulate", str(TOY), "--rounds", "1", "--quiet", "--out", str(tmp_path / "r")]
    code = main([*argv, "--set", "task=bugfactory42:make"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "task 'bugfactory42:make': the factory raised TypeError at bugfactory42.py:2" in err
    assert "inner bug of the factory" in err and not (tmp_path / "r").exists()


def test_7_compare_tuned_stopped_between_removals_can_be_run_again(tmp_path, monkeypatch, capsys):
    import pathlib

    tuned, out = tmp_path / "tune", tmp_path / "report"
    grid = ["--grid", "server-learning-rate=0.1,1", "--mean-trials", "1", "--rounds", "1"]
    assert main(["tune", str(TOY), *grid, "--seed", "3", "--out", str(tuned), "--quiet"]) == 0
    assert main(["compare-tuned", str(tuned), "--out", str(out)]) == 0, capsys.readouterr().err
    real_unlink, removed = pathlib.Path.unlink, []

    def stop_after_two(self, *args, **kwargs):
        if self.parent == out:
            removed.append(self.name)
            if len(removed) == 3:
                raise KeyboardInterrupt
        return real_unlink(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(pathlib.Path, "unlink", stop_after_two)
        assert main(["compare-tuned", str(tuned), "--out", str(out)]) == 130
    assert "report.md" in {p.name for p in out.iterdir()}, removed
    capsys.readouterr()
    assert main(["compare-tuned", str(tuned), "--out", str(out)]) == 0, capsys.readouterr().err


class _Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        return result * 0 if func is torch.linalg.vector_norm else result


def test_8_the_public_clip_l2_never_returns_a_lying_tensor_above_c():
    from fedprivopt.privacy import clip_l2

    with pytest.raises(ValueError, match=r"vector must be a plain torch\.Tensor, got a _Liar"):
        clip_l2(torch.full((100,), 100.0).as_subclass(_Liar), 1.0)
    own = torch.full((100,), 100.0)
    own.detach = lambda: torch.zeros(100)
    result = clip_l2(own, 1.0)
    assert result.clipped and result.norm == pytest.approx(1000.0)
    assert float(torch.linalg.vector_norm(torch.Tensor.detach(result.vector))) <= 1.0
    param = torch.nn.Parameter(torch.full((100,), 100.0))
    kept = clip_l2(param, 1.0)
    assert kept.clipped and kept.vector.requires_grad


def test_9_the_server_app_refuses_an_out_inside_a_run_and_an_unknown_tilde(tmp_path):
    import types

    from fedprivopt.deploy.local import REPO_ROOT
    from fedprivopt.deploy.runconfig import app_config_defaults, check_run_out
    from fedprivopt.deploy.server_app import run_deployment

    simulate(load_config(TOY, {"num-server-rounds": 1}), tmp_path / "A")
    run_config = {**app_config_defaults(REPO_ROOT), "out": str(tmp_path / "A" / "plots" / "sub")}
    context = types.SimpleNamespace(run_config=run_config, run_id=7)
    with pytest.raises(ValueError, match=r"argument out: .*/A/plots/sub is inside the run"):
        run_deployment(None, context)  # refused before the grid is used
    assert not (tmp_path / "A" / "plots").exists()
    with pytest.raises(ValueError, match="starts with ~, but names no user of this machine"):
        check_run_out("~nosuchuser42/x")
    assert check_run_out("runs/x") == "runs/x"
