"""`gdnctl doctor`: can this machine run the preset? Probes gather facts, checks judge them, and the kernel
checks run FLA and FlashQLA against an fp32 reference at the preset's shapes."""

from gdnctl.doctor.report import DoctorResult, doctor_report

__all__ = ["DoctorResult", "doctor_report"]
