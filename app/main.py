"""kneepoint's web app: a router over app/screens, with the shared sidebar."""

from __future__ import annotations

import streamlit as st
from streamlit.navigation.page import StreamlitPage

from app import auth, changes, chrome, data, filters, run_version
from app.registry import PAGES, PAGES_DIR, SECTIONS, section
from kneepoint.config import ConfigError
from kneepoint.secrets import scrub_log_records

# No log line of this process shows a secret of the config, Streamlit's own included (the
# app started by `kneepoint serve` does this before Streamlit starts; `streamlit run` here).
scrub_log_records()
st.set_page_config(page_title="kneepoint", page_icon=":material/monitoring:", layout="wide")
chrome.style()

try:
    who = auth.gate()  # a sign-in page or a refusal stops here
except ConfigError as error:
    st.error(str(error))
    st.stop()

allowed = [spec for spec in PAGES if who.can(spec.role)]
requested = st.query_params.get("page")
# A chat link (/?page=health&range=6h) names its page in the query string: that page is this
# run's default, the one the root address shows, so it opens in one script run (a switch to
# it with st.switch_page would run the script twice).
landing = requested if requested in {spec.url_path for spec in allowed} else PAGES[0].url_path
pages = {
    spec.url_path: st.Page(
        PAGES_DIR / spec.file,
        title=spec.title,
        icon=spec.icon,
        url_path=spec.url_path,
        default=spec.url_path == landing,
    )
    for spec in allowed
}
menu: dict[str, list[StreamlitPage]] = {name: [] for name in SECTIONS}
for spec in PAGES:
    if spec.url_path in pages:
        menu[section(spec)].append(pages[spec.url_path])
# Every page listed (no "View more"), under its section's heading.
page = st.navigation({name: listed for name, listed in menu.items() if listed}, expanded=True)
current_path = next(path for path, candidate in pages.items() if candidate is page)
chrome.tab_title(page.title, page.icon)

if requested in pages and requested != current_path:
    # A link to another page's own address that names a page in its query string.
    st.switch_page(
        pages[requested],
        query_params={
            key: st.query_params.get_all(key) for key in st.query_params if key != "page"
        },
    )

try:
    replicas = data.replica_names()
except ConfigError as error:
    st.error(str(error))
    st.stop()
chosen = filters.sidebar(replicas)
# One data version for the whole run (app/run_version.py): every section, chart marker and
# the footer compute as of its tick, read once here, though the store's moves meanwhile.
run_version.begin(data.config_file(), data.read_version)
changes.mark_charts(chosen)  # every time-series chart marks the timeline's events
st.query_params["page"] = current_path
page.run()
chrome.footer()  # not after a page's st.stop(): that page said why it stopped instead
