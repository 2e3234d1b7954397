"""The Streamlit app, at the top of the layers: a router (main.py) over app/screens, one
small file per page (listed in registry.py), the shared sidebar and chrome, the cached read
path into kneepoint's kernel (data.py, fleet_data.py, insight.py) and the actions a
signed-in user may take (actions.py, checked by kneepoint/auth.py and audited). What belongs
here is how a page reads, lays out and formats what the kernel computed. What does not: any
number or judgement (kneepoint/derived/, kneepoint/status.py and kneepoint/views.py compute
them, so the pages, the command line and the alerts agree), building a Plotly figure
(dashboards/), SQL (kneepoint/store/), and anything the collector runs (collectors/)."""
