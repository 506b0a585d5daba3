"""Streamlit-side helpers: shared sidebar state, cached loaders, figures."""
