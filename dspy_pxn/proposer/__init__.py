"""Where new candidates come from: a step's reflections (``reflection``), the sibling merge that turns a window's
improving children into one candidate (``sibling_merge``), and which improving children are validated
(``selection``)."""
