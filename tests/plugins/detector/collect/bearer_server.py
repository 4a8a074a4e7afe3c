"""A Prometheus endpoint that wants a bearer token: serves a static text
exposition on 127.0.0.1 (HTTP/1.1, keep-alive) to requests carrying
`Authorization: Bearer TOKEN`, 401 to others. Prints its port, then serves
until killed. usage: bearer_server.py TOKEN"""
import http.server
import sys

TOKEN = sys.argv[1]
BODY = b"""# TYPE demo_requests_total counter
demo_requests_total{code="200"} 1027
# TYPE demo_temperature gauge
demo_temperature 21.5
"""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer " + TOKEN
        body = BODY if ok else b"unauthorized\n"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
