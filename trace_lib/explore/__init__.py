"""Exploring trajectories: filtered queries, failure signatures, semantic clusters, transcripts.

`queries` (filters and aggregates in SQL), `clusters` (failure signatures), `embeddings`
(semantic clusters from an offline sentence encoder) and `transcript` (safe HTML rendering
and tool-call alignment). Nothing here imports streamlit.
"""
