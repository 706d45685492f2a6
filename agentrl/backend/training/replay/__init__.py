"""A committed step's recorded input trained again: replay, and what-if variations of it."""
