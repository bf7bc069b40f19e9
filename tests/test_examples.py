"""The examples, the scaling plot and the notebook, at tiny sizes under mpiexec -n 2.

Each test checks what the example claims (the loss falls, the ranks agree, the demo's
accuracy bar), not only its exit status.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import forks  # noqa: E402
from mpi_util import ROOT, mpi_env, run_mpi  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")


def example(name):
    return os.path.join(EXAMPLES, name)


@pytest.mark.parametrize(
    "script",
    [
        "examples/quickstart.py",
        "examples/mlp_regression.py",
        "examples/digits_cnn.py",
        "examples/resnet_synthetic.py",
        "examples/horovod_digits.py",
        "examples/ddp_digits.py",
        "benchmarks/plot_scaling.py",
    ],
)
def test_help(script, forked):
    out = forked.run_file(os.path.join(ROOT, script), ["--help"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:") and "--" in out.stdout


def output_lines(out):
    # run_mpi's output is the job's stdout and stderr; Open MPI's notices aside
    return [line for line in out.splitlines() if line.strip()]


def test_quickstart_prints_from_rank_0_with_a_summary():
    _, out = run_mpi(example("quickstart.py"), 2, timeout=180)
    lines = output_lines(out)
    # rank 0 alone: epoch 1, every tenth of the 100 epochs, then the one summary line
    epochs = [int(e) for e in re.findall(r"^\[0 / 2\] Epoch (\d+): Loss [\d.]+$", out, re.M)]
    assert epochs == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100], out
    assert len(lines) == len(epochs) + 1 and "[1 / 2]" not in out, out
    summary = lines[-1]
    m = re.fullmatch(
        r"quickstart: 2 ranks, 100 epochs in [\d.]+ s; mean loss over ranks: epoch 1 ([\d.]+) "
        r"-> epoch 100 ([\d.]+); parameters identical on all 2 ranks: True",
        summary,
    )
    assert m and float(m.group(2)) < 0.9 * float(m.group(1)), summary


def test_quickstart_all_ranks_loss_falls_on_each():
    _, out = run_mpi(example("quickstart.py"), 2, "--all-ranks", "--epochs", 20, timeout=180)
    for r in range(2):  # every rank prints its own loss on its own data, each epoch
        losses = [
            float(v) for v in re.findall(rf"^\[{r} / 2\] Epoch \d+: Loss ([\d.]+)$", out, re.M)
        ]
        assert len(losses) == 20 and losses[-1] < losses[0], (r, losses)
    assert "parameters identical on all 2 ranks: True" in out


def test_mlp_regression_mse_falls_below_the_best_constant():
    _, out = run_mpi(example("mlp_regression.py"), 2, "--epochs", 8, "--samples", 4000, timeout=180)
    mse = [float(v) for v in re.findall(r"^Epoch: \d+ Mean Squared Error: ([\d.]+)$", out, re.M)]
    assert len(mse) == 8, out  # rank 0 alone prints, once per epoch (a tenth of 8 epochs: 1)
    lines = output_lines(out)
    assert len(lines) == 9 and re.fullmatch(
        r"mlp_regression: 2 ranks, 8 epochs, 4000 samples in [\d.]+ s; mean squared error "
        r"[\d.]+ -> [\d.]+",
        lines[-1],
    ), out
    # The best constant prediction has MSE = Var(target) = 10 Var(x^3) + Var(sin(2 pi u))
    # with x ~ U[1, 2]: 10 (127/7 - (15/4)^2) + 1/2 = 41.3.
    best_constant = 10 * (127 / 7 - (15 / 4) ** 2) + 0.5
    assert mse[-1] < mse[0] / 5 and mse[-1] < best_constant, mse


def test_digits_demo_reaches_the_bar_with_identical_weights(tmp_path):
    summary = tmp_path / "summary.json"
    ckpt = tmp_path / "digits.pt"
    # 8 epochs instead of 30: measured 98.6-99.4% held out over seeds 0-3 on 2 ranks.
    _, out = run_mpi(
        example("digits_cnn.py"),
        2,
        "--epochs",
        8,
        "--summary",
        summary,
        "--checkpoint",
        ckpt,
        timeout=300,
    )
    s = json.loads(summary.read_text())
    assert s["world_size"] == 2 and s["held_out_images"] == 360
    assert s["held_out_accuracy"] >= 0.95, s
    assert s["weights_identical"] and s["max_weight_difference"] == 0.0
    assert s["loss"][-1] < s["loss"][0] / 4, s["loss"]
    assert re.search(r"held-out accuracy: \d+\.\d%", out)
    assert "weights identical on all 2 ranks: yes (all 151,306 parameters equal)" in out
    assert "OK" in out
    assert len(re.findall(r"epoch +\d+/8 +loss", out)) == 8  # one report per epoch, rank 0 only
    # Open MPI gives each rank a pseudo-terminal 0 columns wide: no bar there (tqdm would draw
    # empty lines), the epoch lines are the progress; no line is empty or a bar's remains
    lines = out.splitlines()
    assert all(line.strip() for line in lines), out
    assert not any("\r" in line or "step/s" in line or "it/s" in line for line in lines), lines
    assert ckpt.exists()


def test_digits_demo_fails_loudly_below_the_bar(tmp_path):
    # One epoch cannot reach 99.9%: the demo must say so and exit non-zero.
    rc, out = run_mpi(
        example("digits_cnn.py"),
        2,
        "--epochs",
        1,
        "--no-progress",
        "--min-accuracy",
        0.999,
        timeout=180,
        expect_ok=False,
    )
    assert rc != 0 and "FAILED" in out


def test_horovod_and_ddp_scripts_train_alike_on_fluxmpi():
    # A Horovod script (its import changed) and a DDP script (its backend string changed):
    # at 2 ranks both take SGD steps of lr 0.02 on averaged gradients from rank 0's weights,
    # so they print the same losses, step for step.
    runs = {}
    for script in ("horovod_digits.py", "ddp_digits.py"):
        _, out = run_mpi(example(script), 2, "--epochs", 8, timeout=240)
        assert "weights identical on all 2 ranks: yes" in out and "\nOK" in out, out[-3000:]
        acc = float(re.search(r"held-out accuracy: ([\d.]+)%", out).group(1))
        assert acc >= 90.0, out[-3000:]
        runs[script] = re.findall(r"epoch +\d+/8 +train loss ([\d.]+)", out)
        assert len(runs[script]) == 8, out[-3000:]
        assert float(runs[script][-1]) < float(runs[script][0]) / 3, runs[script]
    assert runs["horovod_digits.py"] == runs["ddp_digits.py"], runs


def test_scaling_plot_quick(tmp_path):
    png, js = tmp_path / "scaling.png", tmp_path / "scaling.json"
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "plot_scaling.py"),
            "--quick",
            "--ranks",
            "1",
            "2",
            "--out",
            str(png),
            "--json-out",
            str(js),
            "--timeout",
            "120",
            "--python",  # the ranks forked from the suite's fork server (tests/forks.py)
            shlex.join(forks.python()),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=mpi_env(),
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = json.loads(js.read_text())["runs"]
    assert [r["ranks"] for r in runs] == [1, 2]
    for r in runs:  # resnet_synthetic ran both modes in each launch
        for mode in ("fluxmpi_py", "ddp_gloo"):
            res = r["results"][mode]
            assert res["step_ms"] > 0
            assert res["images_per_s"] == pytest.approx(
                r["ranks"] * r["batch_per_rank"] * 1e3 / res["step_ms"]
            )
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "scaling" and len(line["table"]) == 2


def test_notebook_runs_top_to_bottom(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for k, v in mpi_env().items():  # the kernel (and the ranks it launches) inherit this
        monkeypatch.setenv(k, v)
    # Under pytest, ipykernel leaves the process's stdout alone; in Jupyter it captures it and
    # its sys.stdout reports the terminal's descriptor. Run the kernel as Jupyter does.
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    path = os.path.join(EXAMPLES, "notebooks", "quickstart.ipynb")
    nb = nbformat.read(path, as_version=4)
    # "python3" resolves to this interpreter (jupyter_client substitutes sys.executable).
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(path)}},
    )
    client.execute()  # raises CellExecutionError if any cell fails
    text = "\n".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "rank 0 of 1" in text  # Init() in a notebook: a world of one
    assert "[0 / 1] Epoch 1: Loss" in text and "[0 / 1] Epoch 100: Loss" in text  # fluxmpi_println
    assert "same weights: True" in text  # checkpoint round trip
    assert "[1 / 2] loss" in text  # launch() streamed rank 1's output into the notebook
    assert "'world': 2" in text and "'identical_weights': True" in text  # rank 0's result
    assert "rank 1 raised ValueError" in text


def test_notebook_shows_a_rank_failure_once(monkeypatch):
    # fm.launch from a notebook, a rank raising: the cell's error names the rank and the cell's
    # line once; the ranks' streamed output holds no traceback and nothing of Open MPI's.
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for k, v in mpi_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import fluxmpi_py as fm"),
        nbformat.v4.new_code_cell(
            "def train(scale):\n"
            "    import fluxmpi_py as fm\n"
            "    print(f'step on rank {fm.local_rank()}', flush=True)\n"
            "    if fm.local_rank() == 1:\n"
            "        raise ValueError(f'bad scale {scale}')\n"
            "    fm.barrier()\n"
            "    return scale"
        ),
        nbformat.v4.new_code_cell("fm.launch(train, 3, np=2, timeout=120)"),
    ]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True)
    client.execute()
    outputs = nb.cells[2].outputs
    streamed = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    (error,) = [o for o in outputs if o["output_type"] == "error"]
    assert error["ename"] == "LaunchError", error
    assert error["evalue"].startswith("launch: rank 1 of 2 raised ValueError: bad scale 3"), error
    # the rank's frame is the cell's line, as IPython names cells, with its source
    assert (
        "Cell In[2], line 5, in train\n    raise ValueError(f'bad scale {scale}')"
        in (error["evalue"])
    ), error["evalue"]
    assert "<dynamic-code>" not in error["evalue"] and error["evalue"].count("Traceback") == 1
    assert "step on rank 0" in streamed and "step on rank 1" in streamed, streamed
    assert "Traceback" not in streamed and "ValueError" not in streamed, streamed
    noise = ("MPI_ABORT", "ORTE", "Out of resource", "Data unpack", "Primary job", "prterun", "---")
    assert not [n for n in noise if n in streamed], streamed
