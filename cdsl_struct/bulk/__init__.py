"""Bulk jobs: JSON lines in, JSON lines out (``cdsl-struct batch``), locally or on Ray Data."""

from .job import BatchJob, JobSummary, run_job

__all__ = ["BatchJob", "JobSummary", "run_job"]
