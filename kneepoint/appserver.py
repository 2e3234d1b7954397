"""The app's process: Streamlit, with kneepoint's log scrubbing from its first line.

`kneepoint serve` and `kneepoint demo` start `python -m kneepoint.appserver run app/main.py
…` (kneepoint/webapp.py) instead of `python -m streamlit`: every log record of the process
is scrubbed (kneepoint/secrets.py `scrub_log_records`; Streamlit's and uvicorn's loggers
write through handlers of their own, which a root handler would not reach), and the config
is read first, so its secrets are known to `scrub` before Streamlit logs anything. A config
that does not load is left to the app's pages to report, as with `streamlit run`.
"""

from __future__ import annotations

import contextlib
import os

from kneepoint.secrets import scrub_log_records


def main() -> None:
    scrub_log_records()
    from kneepoint.config import ConfigError, load_config

    with contextlib.suppress(ConfigError):  # the app's pages say what is wrong with it
        load_config(os.environ.get("KNEEPOINT_CONFIG"))  # its Secrets are remembered
    from streamlit.web.cli import main as streamlit

    streamlit(prog_name="streamlit")


if __name__ == "__main__":
    main()
