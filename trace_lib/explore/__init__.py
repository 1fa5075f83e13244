"""Exploring trajectories: filtered queries, failure signatures, semantic clusters, transcripts.

`queries` (filters and aggregates in SQL), `clusters` (failure signatures), `embeddings`
(semantic clusters from an offline sentence encoder), `search` (the full-text index);
the transcript viewer, one concern a module: `transcript_loading` (one trajectory with the
viewer's extras, its task's trials), `call_alignment` (tool calls aligned, expected vs
actual), `search_highlight` (search hits marked and counted), `untrusted_text` (the one
escape for HTML and for markdown), `transcript_render` (the HTML/JS renderer and the CLI's
text); `trajectory_charts` (the page's figures) and `chart_labels` (the label-fitting rule
every explore and diagnose figure ends with). Nothing here imports streamlit.
"""
