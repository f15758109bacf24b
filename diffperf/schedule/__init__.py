"""Schedule: turn op times into a step time (overlap, pipeline bubble, exposed communication)."""
