// Runs the HTTP-caching conformance suite (a folder holding http-tests/cache-tests' `tests/` and
// `test-engine/`) against BASE_URL with Node's own fetch, and prints the results as JSON (test id:
// true, or [error name, message]). Used by cache-conformance.sh.
//
//   node cache-conformance-driver.mjs SUITE_DIR BASE_URL [private|shared]
//
// `private` (the default) selects the tests the suite runs on browsers: browser-only tests
// included, shared-cache-only and CDN-only ones left out. `shared` selects what it runs on proxies.
// CACHE_TEST_ID=<id> runs that one test and prints the suite's dump of its exchanges.
import path from 'node:path'
import { pathToFileURL } from 'node:url'

const [suiteDir, baseUrl, mode = 'private'] = process.argv.slice(2)
if (!suiteDir || !baseUrl || !['private', 'shared'].includes(mode)) {
  console.error('usage: node cache-conformance-driver.mjs SUITE_DIR BASE_URL [private|shared]')
  process.exit(64)
}
const load = relative => import(pathToFileURL(path.resolve(suiteDir, relative)).href)
const { runTests, getResults } = await load('test-engine/client/runner.mjs')
let { default: suites } = await load('tests/index.mjs')

const only = process.env.CACHE_TEST_ID
if (only) {
  suites = suites
    .map(suite => ({ ...suite, tests: suite.tests.filter(test => test.id === only) }))
    .filter(suite => suite.tests.length > 0)
  suites.forEach(suite => suite.tests.forEach(test => { test.dump = true }))
}

await runTests(suites, globalThis.fetch, mode === 'private', baseUrl.replace(/\/$/, ''))
process.stdout.write(JSON.stringify(getResults(), null, 2) + '\n')
