"""Views of a run drawn from its recorded metrics alone (no torch, no GPU): the training-progress plot, TensorBoard
event files, the experiment page. The rank side calls them from a background thread, the login node from files."""
