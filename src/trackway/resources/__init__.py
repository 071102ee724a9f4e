"""Where runs may go: the declared resources, their live availability, and the choice among them."""
