# Filled in by the MLA decode kernel work (issue 6).
