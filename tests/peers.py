#!/usr/bin/env python3
"""Real peers for tests/edge.rs, written with the libraries clients of a gateway use.

    peers.py certs DIR                 CA-signed certificates (see certs())
    peers.py grpc-server PORT_FILE     a gRPC server (grpcio) on a free port, written to PORT_FILE
    peers.py grpc-client ADDR KEY N    N unary calls, then one server-streaming call, through ADDR
    peers.py grpc-call ADDR METHOD HEX CA [CERT KEY]
                                       one unary call of raw request bytes (hex) over TLS trusting
                                       CA (`plain`: cleartext), with a client certificate if given
    peers.py ws-server PORT_FILE       a WebSocket echo server (websockets)
    peers.py ws-client URL KEY         one WebSocket exchange through URL

Clients print one JSON line with what they saw. Messages are raw bytes (no protobuf): grpcio's
generic handlers pass bytes through when no serializer is given.
"""
import asyncio
import datetime
import json
import os
import sys
import time


def certs(out):
    """ca.pem/ca.key; server.pem/.key for localhost signed by the CA; expired.pem/.key (the same
    name, expired yesterday); client-ca.pem and client.pem/.key signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, cert, key):
        with open(os.path.join(out, stem + ".pem"), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(os.path.join(out, stem + ".key"), "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))

    def ca(stem):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(stem)).issuer_name(name(stem))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                               critical=True)
                .sign(key, hashes.SHA256()))
        write(stem, cert, key)
        return cert, key

    def leaf(stem, issuer, before, after, client=False):
        icert, ikey = issuer
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(stem)).issuer_name(icert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(before).not_valid_after(after)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if client:
            b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        else:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        write(stem, b.sign(ikey, hashes.SHA256()), key)

    authority = ca("ca")
    leaf("server", authority, now - datetime.timedelta(days=1), now + datetime.timedelta(days=2))
    leaf("expired", authority, now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
    leaf("client", ca("client-ca"), now - datetime.timedelta(days=1),
         now + datetime.timedelta(days=2), client=True)


def grpc_server(port_file):
    import grpc
    from concurrent import futures

    def echo(request, context):
        context.set_trailing_metadata((("x-trailer", "kept"),))
        return b"echo:" + request

    def count(request, context):
        for i in range(int(request.decode() or "3")):
            yield str(i).encode()

    handler = grpc.method_handlers_generic_handler("test.Peer", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Count": grpc.unary_stream_rpc_method_handler(count),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(port_file + ".tmp", port_file)
    server.wait_for_termination()


def grpc_client(addr, key, n):
    import grpc

    metadata = (("x-api-key", key),)
    out = {"unary": [], "stream": None}
    with grpc.insecure_channel(addr) as channel:
        echo = channel.unary_unary("/test.Peer/Echo")
        for i in range(int(n)):
            try:
                reply, call = echo.with_call(b"hi%d" % i, metadata=metadata, timeout=10)
                trailers = dict(call.trailing_metadata() or ())
                out["unary"].append({"code": "OK", "reply": reply.decode(),
                                     "trailer": trailers.get("x-trailer")})
            except grpc.RpcError as e:
                headers = dict(e.initial_metadata() or ()) | dict(e.trailing_metadata() or ())
                out["unary"].append({"code": e.code().name, "message": e.details(),
                                     "retry_after": headers.get("retry-after")})
        count = channel.unary_stream("/test.Peer/Count")
        try:
            out["stream"] = [m.decode() for m in count(b"5", metadata=metadata, timeout=10)]
        except grpc.RpcError as e:
            out["stream"] = e.code().name
    print(json.dumps(out))


def grpc_call(addr, method, request, ca, cert=None, key=None):
    import grpc

    read = lambda path: open(path, "rb").read()
    if ca == "plain":
        channel = grpc.insecure_channel(addr)
    else:
        creds = grpc.ssl_channel_credentials(
            read(ca), read(key) if key else None, read(cert) if cert else None)
        channel = grpc.secure_channel(addr, creds)
    with channel:
        try:
            reply = channel.unary_unary(method)(bytes.fromhex(request), timeout=10)
            print(json.dumps({"code": "OK", "reply": reply.hex()}))
        except grpc.RpcError as e:
            print(json.dumps({"code": e.code().name, "message": e.details()}))


def ws_server(port_file):
    import websockets.asyncio.server as ws

    async def echo(conn):
        async for message in conn:
            await conn.send(message)

    async def main():
        async with ws.serve(echo, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            with open(port_file + ".tmp", "w") as f:
                f.write(str(port))
            os.rename(port_file + ".tmp", port_file)
            await asyncio.Future()

    asyncio.run(main())


def ws_client(url, key):
    import websockets.asyncio.client as ws

    async def main():
        async with ws.connect(url, additional_headers={"X-Api-Key": key}, open_timeout=10) as conn:
            got = []
            for text in ("hello", "x" * 100000):
                await conn.send(text)
                got.append(await asyncio.wait_for(conn.recv(), 10))
            await conn.send(b"\x00\x01binary")
            binary = await asyncio.wait_for(conn.recv(), 10)
            limit = conn.response.headers.get("RateLimit-Remaining")
            return {"echo": [got[0], len(got[1])], "binary": binary.hex(), "remaining": limit}

    try:
        print(json.dumps(asyncio.run(main())))
    except Exception as e:  # the refusal's status, for the test to read
        status = getattr(getattr(e, "response", None), "status_code", None)
        print(json.dumps({"error": type(e).__name__, "status": status}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"certs": certs, "grpc-server": grpc_server, "grpc-client": grpc_client, "grpc-call": grpc_call,
     "ws-server": ws_server, "ws-client": ws_client}[cmd](*args)
