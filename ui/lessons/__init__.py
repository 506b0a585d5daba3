"""The Lessons page and the lesson bar: lessons a teacher prepares and presents (analysis.lessons)."""
