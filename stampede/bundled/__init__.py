"""The files an installed stampede carries: the job files, the sbatch templates and the
archive's README.

They live at the top of the repository (`jobs/`, `slurm/`, `results/README.md`), where
people read them; the entries here are symbolic links to them, which the wheel turns into
copies, so a clone and an install find them at the same place.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
JOBS_DIR = HERE / "jobs"
SLURM_DIR = HERE / "slurm"
RESULTS_README = HERE / "results-README.md"


def job_files() -> list[Path]:
    """The bundled job files, sorted by name."""
    return sorted(JOBS_DIR.glob("*.toml"))
