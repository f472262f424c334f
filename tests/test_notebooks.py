"""The notebooks run top to bottom without errors (in a temporary copy) and are stored without outputs."""

import shutil
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "python3"
CELL_TIMEOUT_S = 300

# (name, loads the default model)
CASES = [
    ("01_quickstart.ipynb", True),
    ("02_losslessness.ipynb", False),
    ("03_ablation.ipynb", True),
    ("04_train_a_drafter.ipynb", True),
]


def _ensure_kernel() -> None:
    if KERNEL not in KernelSpecManager().find_kernel_specs():
        from ipykernel.kernelspec import install

        install(user=True, kernel_name=KERNEL)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.real_model] if real else []) for name, real in CASES]
)
def test_notebook_runs(name, tmp_path):
    _ensure_kernel()
    path = tmp_path / name
    shutil.copy(NOTEBOOKS / name, path)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"{name}: a cell raised\n{error}")
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors, f"{name}: error outputs {errors}"


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(name for name, _ in CASES)


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_notebook_is_stripped(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs are not stripped"
