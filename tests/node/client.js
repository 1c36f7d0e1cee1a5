// A Node.js client of voxstage.v1.Speech, built from the repository's protos/ and nothing else.
// Usage: node client.js HOST:PORT PROTO_ROOT
// Prints one JSON line per check ({"check", "ok", "detail"}) so the Python test can report each one.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const [address, protoRoot] = process.argv.slice(2);
const MAX_FRAMES = 4;

const definition = protoLoader.loadSync(path.join(protoRoot, "voxstage/v1/speech.proto"), {
  includeDirs: [protoRoot],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const { Speech } = grpc.loadPackageDefinition(definition).voxstage.v1;
const client = new Speech(address, grpc.credentials.createInsecure());

function report(check, ok, detail) {
  console.log(JSON.stringify({ check, ok, detail }));
}

function deadline() {
  return new Date(Date.now() + 60_000);
}

function config() {
  return { encoding: "AUDIO_ENCODING_PCM_S16LE", voice: "ryan", sampling: { max_frames: MAX_FRAMES } };
}

// (a) unary Synthesize reports a measured time to first audio.
function unary() {
  return new Promise((resolve) => {
    client.Synthesize({ config: config(), text: "Hello from Node." }, { deadline: deadline() }, (err, reply) => {
      if (err) return resolve(report("unary_ttfa", false, `${err.code} ${err.details}`));
      const ttfa = reply.summary.time_to_first_audio || {};
      const seconds = Number(ttfa.seconds || 0) + Number(ttfa.nanos || 0) / 1e9;
      resolve(report("unary_ttfa", seconds > 0 && reply.audio.length > 0, { seconds, bytes: reply.audio.length }));
    });
  });
}

// (b) two flushed segments in one StreamingSynthesize, each with its own audio and segment_done.
function streaming() {
  return new Promise((resolve) => {
    const call = client.StreamingSynthesize({ deadline: deadline() });
    const audio = {};
    const done = [];
    call.on("data", (msg) => {
      if (msg.response === "audio" && msg.audio.data.length > 0) {
        audio[msg.audio.segment_index] = (audio[msg.audio.segment_index] || 0) + msg.audio.data.length;
      } else if (msg.response === "segment_done") {
        done.push(msg.segment_done.segment_index);
      }
    });
    call.on("error", (err) => resolve(report("two_segments", false, `${err.code} ${err.details}`)));
    call.on("end", () => {
      const ok = done.length === 2 && done[0] === 0 && done[1] === 1 && audio[0] > 0 && audio[1] > 0;
      resolve(report("two_segments", ok, { segment_done: done, audio_bytes: audio }));
    });
    call.write({ config: config() });
    call.write({ text: "First part." });
    call.write({ flush: {} });
    call.write({ text: "Second part." });
    call.write({ flush: {} });
    call.end();
  });
}

// (c) grpc.reflection.v1 lists the services. Its .proto is not in protos/, so the few messages needed are
// declared here (field numbers of grpc/reflection/v1/reflection.proto).
const reflection = protobuf.Root.fromJSON({
  nested: {
    Request: { fields: { host: { type: "string", id: 1 }, list_services: { type: "string", id: 7 } } },
    Response: { fields: { list_services_response: { type: "Listed", id: 6 } } },
    Listed: { fields: { service: { rule: "repeated", type: "Named", id: 1 } } },
    Named: { fields: { name: { type: "string", id: 1 } } },
  },
});
const Request = reflection.lookupType("Request");
const Response = reflection.lookupType("Response");

function reflect() {
  return new Promise((resolve) => {
    const raw = new grpc.Client(address, grpc.credentials.createInsecure());
    const call = raw.makeBidiStreamRequest(
      "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
      (msg) => Buffer.from(Request.encode(Request.create(msg)).finish()),
      (buf) => Response.toObject(Response.decode(buf)),
      new grpc.Metadata(),
      { deadline: deadline() },
    );
    const names = [];
    call.on("data", (msg) => {
      for (const s of (msg.list_services_response || {}).service || []) names.push(s.name);
    });
    call.on("error", (err) => {
      raw.close();
      resolve(report("reflection_v1", false, `${err.code} ${err.details}`));
    });
    call.on("end", () => {
      raw.close();
      resolve(report("reflection_v1", names.includes("voxstage.v1.Speech"), { services: names }));
    });
    call.write({ list_services: "" });
    call.end();
  });
}

(async () => {
  await unary();
  await streaming();
  await reflect();
  client.close();
})();
