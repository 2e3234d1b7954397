"""The Streamlit app: a router (main.py), one small file per page, shared sidebar and data."""
