"""Pure figure builders: a DataFrame in, a Plotly figure out. No Streamlit, no store."""
