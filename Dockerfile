# One image for the kneepoint collector and app.
FROM python:3.11-slim
WORKDIR /opt/kneepoint
COPY pyproject.toml README.md ./
COPY kneepoint ./kneepoint
COPY collectors ./collectors
COPY alerts ./alerts
COPY dashboards ./dashboards
COPY app ./app
RUN pip install --no-cache-dir -e .
ENV KNEEPOINT_CONFIG=/etc/kneepoint/kneepoint.yaml
EXPOSE 8501
CMD ["kneepoint", "serve", "--no-browser"]
