"""How ranks find each other and talk: discovery, shares of each batch, gradient all-reduce."""
