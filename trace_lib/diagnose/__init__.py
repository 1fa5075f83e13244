"""Stage 1, diagnose: which capabilities does the agent lack?

Modules (each a use case in `trace_lib.workbench.diagnose`, a CLI verb, a page, a notebook cell):
    capability_curation  the menu in the store: built-in, user and LLM-proposed (from
                         contrastive pairs) capabilities, accepted / proposed / rejected
    transcript_prompt    a transcript as labeler prompts show it (`[idx]`-prefixed text)
    labelers/            Labeler protocol + registry: heuristic (offline), anthropic, openai
    labeling             N independent labeling runs written as label runs
    labels               grid, append-only edits with undo, review queue, CSV import/export
    ranking              Cov / ER- / ER+ / Delta per run, K-of-N selection, Wilson, Fisher,
                         greedy cover, failure clusters, selected_capabilities.json
    label_quality        labels vs planted deficits (demo) and tau2's reward breakdown
    stability            K-of-N over label runs or bootstrap resamples; sensitivity of the
                         keep rule to one flipped label
    agreement            Fleiss / Cohen kappa (runs, labelers, people); the review queue by
                         disagreement and ranking sensitivity
    ranking_charts       plotly figures for the Rankings page and the notebook
"""
