"""Generator role: inference engines and the loop that streams scored groups to the buffer."""
