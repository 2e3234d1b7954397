"""Every page of the app, in menu order. Tests check that each file in app/screens is here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kneepoint.auth import Role

# Not "pages/": Streamlit would also discover that folder by itself (its older multipage
# convention) and route to paths named after the files before st.navigation takes over.
PAGES_DIR = Path(__file__).resolve().parent / "screens"


@dataclass(frozen=True)
class PageSpec:
    file: str
    title: str
    icon: str
    url_path: str
    role: Role = "viewer"  # who sees it in the menu; the page checks it again itself


PAGES = (
    PageSpec("overview.py", "Overview", ":material/monitoring:", "overview"),
    PageSpec("alerts.py", "Alerts", ":material/notifications_active:", "alerts"),
    PageSpec("timeline.py", "Timeline", ":material/timeline:", "timeline"),
    PageSpec("slos.py", "SLOs", ":material/speed:", "slos"),
    PageSpec("capacity.py", "Capacity", ":material/memory:", "capacity"),
    PageSpec("prefix_cache.py", "Prefix cache", ":material/cached:", "prefix-cache"),
    PageSpec("spec_decode.py", "Speculative decoding", ":material/fast_forward:", "spec-decode"),
    PageSpec("knee.py", "Knee points", ":material/show_chart:", "knee"),
    PageSpec("cost.py", "Cost", ":material/payments:", "cost"),
    PageSpec("whatif.py", "What-if", ":material/science:", "what-if"),
    PageSpec("weekly.py", "Weekly review", ":material/summarize:", "weekly-review"),
    PageSpec("gpus.py", "GPUs", ":material/developer_board:", "gpus"),
    PageSpec("health.py", "Collector health", ":material/health_and_safety:", "health"),
    PageSpec("audit.py", "Audit", ":material/policy:", "audit", role="admin"),
)

# The menu's sections in order, and their pages by url_path; any other page is under
# DEFAULT_SECTION. Within a section pages keep PAGES' order.
SECTIONS: dict[str, tuple[str, ...]] = {
    "On call": ("overview", "alerts", "timeline", "slos", "health"),
    "Capacity": (),
    "Review": ("weekly-review",),
    "Admin": ("audit",),
}
DEFAULT_SECTION = "Capacity"


def section(spec: PageSpec) -> str:
    """The menu section `spec` is listed under."""
    found = (name for name, paths in SECTIONS.items() if spec.url_path in paths)
    return next(found, DEFAULT_SECTION)
