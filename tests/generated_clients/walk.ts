// A client generated from leasestar's served OpenAPI document by openapi-typescript, used
// through openapi-fetch exactly as their READMEs show: walk a list by cursor, read the sync
// feed, get a record by id, read a typed 400. Prints what it saw as JSON for the test.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type ListQuery = NonNullable<paths["/v1/applicants"]["get"]["parameters"]["query"]>;
type ErrorCode = components["schemas"]["ErrorDetail"]["code"];

const [baseUrl, token] = process.argv.slice(2);
if (baseUrl === undefined || token === undefined) throw new Error("usage: walk BASE_URL TOKEN");
// The list's 200 also documents the NDJSON stream (`Accept: application/x-ndjson`), so the
// client names the media type it reads, or openapi-fetch types `data` as either body.
const client = createClient<paths, `${string}/json`>({
  baseUrl,
  headers: { Authorization: `Bearer ${token}` },
});

async function walk(first: ListQuery): Promise<{ ids: string[]; changeSeq: number | undefined }> {
  const ids: string[] = [];
  let query: ListQuery = first;
  for (;;) {
    const { data, error } = await client.GET("/v1/applicants", { params: { query } });
    if (error !== undefined) throw new Error(`${error.error.code}: ${error.error.message}`);
    ids.push(...data.results.map((applicant) => applicant.id));
    if (!data.meta.hasMore || data.meta.next === undefined) {
      return { ids, changeSeq: data.meta.changeSeq };
    }
    query = { cursor: data.meta.next };
  }
}

const listed = await walk({ limit: 40, "order-by": "last_name,first_name" });
const synced = await walk({ changed_since: 0, limit: 100 });

const firstId = listed.ids[0];
if (firstId === undefined) throw new Error("the list is empty");
const one = await client.GET("/v1/applicants/{id}", { params: { path: { id: firstId } } });
if (one.data === undefined) throw new Error("get by id failed");
const createdAt: string = one.data.results.created_at;

// An instant parameter takes a date as well as a datetime.
const since2023 = await client.GET("/v1/applicants", {
  params: { query: { updated_at_gte: "2023-01-01" } },
});
if (since2023.data === undefined) throw new Error("updated_at_gte=2023-01-01 was refused");

const refused = await client.GET("/v1/applicants", { params: { query: { limit: 0 } } });
if (refused.error === undefined) throw new Error("limit=0 was not refused");
const code: ErrorCode = refused.error.error.code;
const parameter: string | undefined = refused.error.error.details.parameter;
const value: string | undefined = refused.error.error.details.value;

console.log(
  JSON.stringify({
    walk: listed.ids,
    sync: synced.ids,
    change_seq: synced.changeSeq,
    get: one.data.results.id,
    created_at: createdAt,
    updated_since_2023: since2023.data.meta.total,
    error: [refused.response.status, code, parameter, value],
  }),
);
