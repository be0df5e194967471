"""A local GCS for tests: gcp-storage-emulator (PyPI) behind the endpoints that TensorFlow's
and tensorstore's gcs clients call, so gs:// paths are read and written offline.

`start(workdir, bucket)` runs this file as a child process (the emulator, in memory, and
a proxy) and returns it with the environment variables that point both clients at it:

* tensorstore's gcs kvstore: `TENSORSTORE_GCS_HTTP_URL` (the emulator's http://host:port).
* TensorFlow's GCS filesystem (tf.io.gfile, and etils.epath, which uses it for gs://) has
  no endpoint setting: it always calls https://www.googleapis.com and
  https://storage.googleapis.com. Its libcurl honours `https_proxy`, and its CA bundle is
  `CURL_CA_BUNDLE` (xla/tsl/platform/cloud/curl_http_request.cc), so the child also runs a
  CONNECT proxy that answers for those two hosts with a certificate made here, and passes
  each request on to the emulator (with the emulator's Host, so the upload URLs it hands
  out point at it directly: `no_proxy` covers them).
* Both clients: `GOOGLE_AUTH_TOKEN_FOR_TESTING` (a fixed bearer token, no credential
  search) and `NO_GCE_CHECK` (TensorFlow does not probe the GCE metadata server).

The child corrects where the emulator answers unlike GCS (each seen with TensorFlow's or
tensorstore's client): an upload with an empty body (the directory markers
tf.io.gfile.makedirs writes) failed on `len(None)`; a chunked body that also carries
Content-Length was read by Content-Length, where RFC 9112 6.3 says the chunked coding
wins; `Expect: 100-continue` went unanswered (an HTTP/1.0 server), so curl waited a second
per upload; a listing ignored `startOffset` / `endOffset` (tensorstore lists and deletes
a directory by key range). In memory it also skips re-serialising every object's metadata
after each write (the emulator's on-disk state, read only at start-up).

`install_gcloud(bin_dir)` writes a `gcloud` whose `storage mv` T5X's legacy Checkpointer
runs to finalise a gs:// checkpoint (the real CLI is not installed here).
"""

import datetime
import json
import logging
import os
import shlex
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

HOSTS = ('www.googleapis.com', 'storage.googleapis.com')  # TensorFlow's GCS endpoints


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _certificate(workdir):
  """A self-signed certificate for HOSTS (and its key), written under `workdir`."""
  # pylint: disable=g-import-not-at-top
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'specdec_t5x test GCS')])
  now = datetime.datetime.now(datetime.timezone.utc)
  cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]),
                         critical=False)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(key, hashes.SHA256()))
  cert_file, key_file = os.path.join(workdir, 'cert.pem'), os.path.join(workdir, 'key.pem')
  with open(cert_file, 'wb') as f:
    f.write(cert.public_bytes(serialization.Encoding.PEM))
  with open(key_file, 'wb') as f:
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
  return cert_file, key_file


def _pipe(src, dst):
  try:
    while data := src.recv(1 << 16):
      dst.sendall(data)
  except OSError:
    pass
  finally:
    for s in (src, dst):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass


def _read_head(sock):
  """Bytes up to the end of an HTTP request's headers (and whatever followed), or None."""
  head = b''
  while b'\r\n\r\n' not in head:
    chunk = sock.recv(1 << 16)
    if not chunk:
      return None
    head += chunk
  return head


def _tunnel(conn, context, upstream):
  """One CONNECT to HOSTS: TLS with our certificate, then the request to the emulator
  (which answers HTTP/1.0: one request per connection)."""
  with conn:
    head = _read_head(conn)
    if head is None:
      return
    method, target = head.split(b' ', 2)[:2]
    if method != b'CONNECT' or target.decode().rsplit(':', 1)[0] not in HOSTS:
      conn.sendall(b'HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n')
      return
    conn.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
    with context.wrap_socket(conn, server_side=True) as tls:
      head = _read_head(tls)
      if head is None:
        return
      host = b'Host: %s:%d' % (upstream[0].encode(), upstream[1])
      lines = [host if l.lower().startswith(b'host:') else l for l in head.split(b'\r\n')]
      with socket.create_connection(upstream) as up:
        up.sendall(b'\r\n'.join(lines))
        back = threading.Thread(target=_pipe, args=(up, tls), daemon=True)
        back.start()
        _pipe(tls, up)
        back.join()


def _patch_emulator():
  """The corrections of the module docstring."""
  # pylint: disable=g-import-not-at-top,protected-access
  from gcp_storage_emulator import server, storage
  from gcp_storage_emulator.handlers import objects
  media_upload, read_raw = objects._media_upload, server._read_raw_data
  parse = server.RequestHandler.parse_request
  list_objects = objects.ls

  def _media_upload(request, response, store):
    if request.data is None:
      request._data = b''
    return media_upload(request, response, store)

  def _read_raw_data(handler):
    if (handler.headers.get('Transfer-Encoding') or '').lower() == 'chunked':
      del handler.headers['Content-Length']
    return read_raw(handler)

  def parse_request(handler):
    ok = parse(handler)
    if ok and (handler.headers.get('Expect') or '').lower() == '100-continue':
      handler.wfile.write(b'HTTP/1.1 100 Continue\r\n\r\n')
    return ok

  def ls(request, response, store, *args, **kwargs):
    start, end = ((request.query.get(k) or [None])[0] for k in ('startOffset', 'endOffset'))
    if start or end:
      send = response.json

      def filtered(listing):
        for field, name in (('items', lambda i: i['name']), ('prefixes', lambda p: p)):
          listing[field] = [x for x in listing.get(field) or ()
                            if (not start or name(x) >= start) and (not end or name(x) < end)]
        send(listing)
      response.json = filtered
    return list_objects(request, response, store, *args, **kwargs)

  objects._media_upload, server._read_raw_data = _media_upload, _read_raw_data
  for _, methods in server.HANDLERS:
    for method, handler in methods.items():
      if handler is list_objects:
        methods[method] = ls
  storage.Storage._write_config_to_file = lambda self: None  # in memory: read at start only
  server.RequestHandler.parse_request = parse_request
  socketserver.TCPServer.request_queue_size = 256  # tensorstore opens many connections


def _serve(workdir, bucket):
  """The child: the emulator (one in-memory bucket) and the proxy, until killed or until
  its parent closes its stdin (by exiting, too)."""
  threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
  _patch_emulator()
  logging.disable(logging.ERROR)  # "Resource not found" for every probe of a new object
  from gcp_storage_emulator.server import create_server  # pylint: disable=g-import-not-at-top
  port = _free_port()
  emulator = create_server('127.0.0.1', port, in_memory=True, default_bucket=bucket)
  emulator.start()
  cert_file, key_file = _certificate(workdir)
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.load_cert_chain(cert_file, key_file)
  listener = socket.create_server(('127.0.0.1', 0), backlog=256)
  print(json.dumps({'port': port, 'proxy_port': listener.getsockname()[1],
                    'cert': cert_file}), flush=True)
  while True:
    conn, _ = listener.accept()
    threading.Thread(target=_tunnel, args=(conn, context, ('127.0.0.1', port)),
                     daemon=True).start()


def _gcloud_storage_mv(src, dst):
  """`gcloud storage mv SRC DST` of a directory, through tensorstore's gcs kvstore: what
  T5X's legacy Checkpointer runs to finalise a gs:// checkpoint (copy, then delete)."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  src, dst = (ts.KvStore.open(url.rstrip('/') + '/').result() for url in (src, dst))
  keys = src.list().result()
  reads = [src.read(k) for k in keys]
  writes = [dst.write(k, r.result().value) for k, r in zip(keys, reads)]
  for w in writes:
    w.result()
  src.delete_range(ts.KvStore.KeyRange()).result()


def install_gcloud(bin_dir):
  """Writes a `gcloud` into `bin_dir` that runs `storage mv` as above (put it on PATH)."""
  os.makedirs(bin_dir, exist_ok=True)
  path = os.path.join(bin_dir, 'gcloud')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
            f'{shlex.quote(os.path.abspath(__file__))} gcloud "$@"\n')
  os.chmod(path, 0o755)
  return path


def start(workdir, bucket):
  """-> (child process, environment variables for gcs clients) of an emulator serving an
  empty `bucket`; the caller terminates the process."""
  proc = subprocess.Popen([sys.executable, __file__, 'serve', str(workdir), bucket],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  if not line:
    proc.wait(timeout=30)
    raise RuntimeError(f'the GCS emulator did not start (exit code {proc.returncode})')
  info = json.loads(line)
  url = f'http://127.0.0.1:{info["port"]}'
  for _ in range(100):
    try:
      urllib.request.urlopen(url + '/', timeout=5).read()
      break
    except OSError:
      time.sleep(0.1)
  env = {'TENSORSTORE_GCS_HTTP_URL': url,
         'https_proxy': f'http://127.0.0.1:{info["proxy_port"]}',
         'no_proxy': '127.0.0.1,localhost', 'CURL_CA_BUNDLE': info['cert'],
         'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator', 'NO_GCE_CHECK': 'True'}
  return proc, env


if __name__ == '__main__':
  if sys.argv[1] == 'serve':
    _serve(*sys.argv[2:4])
  elif sys.argv[2:4] == ['storage', 'mv'] and len(sys.argv) == 6:
    _gcloud_storage_mv(*sys.argv[4:6])
  else:
    sys.exit(f'gcs_emulator.py: unsupported command {sys.argv[1:]}')
