// The check helpers the node tests share: each check prints one line, and the first failure
// throws (the script then exits non-zero).
import OpenAI from "openai";

export function expect(cond, msg) {
  if (!cond) throw new Error("check failed: " + msg);
}

export async function check(name, fn) {
  await fn();
  console.log("ok   " + name);
}

// Awaits `promise`, which must fail with an OpenAI.APIError of HTTP `status`; returns the error.
export async function expectError(promise, status, what) {
  try {
    await promise;
  } catch (e) {
    expect(e instanceof OpenAI.APIError, `${what}: an APIError, got ${e}`);
    expect(e.status === status, `${what}: status ${status}, got ${e.status} (${e.message})`);
    return e;
  }
  throw new Error(`check failed: ${what} succeeded`);
}

// expectError for a request refused for one parameter: the error names `param`.
export async function expectParamError(promise, status, param) {
  const e = await expectError(promise, status, `param ${param}`);
  expect(e.param === param, `param ${param}, got ${e.param}`);
}
