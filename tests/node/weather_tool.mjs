// The get_weather tool both node tool tests offer: a bounded schema, so that a random model's
// constrained call ends, and the check that a call's arguments follow it.
import { expect } from "./check.mjs";

export const WEATHER_NAME = "get_weather";
export const WEATHER_DESCRIPTION = "Weather in a city";
export const WEATHER_PARAMETERS = {
  type: "object",
  properties: { city: { enum: ["Paris", "Oslo"] }, unit: { enum: ["c", "f"] } },
  required: ["city", "unit"],
  additionalProperties: false,
};

// Parses a get_weather call's arguments (throws when not JSON) and checks them against the schema.
export function checkWeatherArgs(text) {
  const args = JSON.parse(text);
  expect(["Paris", "Oslo"].includes(args.city) && ["c", "f"].includes(args.unit),
         `arguments follow the schema: ${text}`);
  return args;
}
