"""The weekly capacity review: numbers, recommendations, HTML and Markdown, scheduling."""
