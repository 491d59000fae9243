#include "core/storage/s3/s3_wire.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>

#include "core/base/testing/status_matchers.h"
#include "core/base/testing/temp_dir.h"
#include "core/storage/s3/s3_config.h"

namespace distckpt {
namespace s3 {
namespace {

TEST(S3Wire, ParsesUrls) {
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Location a, ParseS3Url("s3://ckpts/run1/step-200"));
  EXPECT_EQ(a.bucket, "ckpts");
  EXPECT_EQ(a.key, "run1/step-200");
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Location b, ParseS3Url("s3://ckpts"));
  EXPECT_EQ(b.key, "");
  EXPECT_TRUE(StatusIs(ParseS3Url("gs://ckpts/x").status(), StatusCode::kInvalidArgument, {"gs://ckpts/x"}));
  EXPECT_TRUE(StatusIs(ParseS3Url("s3:///x").status(), StatusCode::kInvalidArgument, {"bucket"}));
  // Nothing that would change the request's host or path gets through as a bucket.
  EXPECT_FALSE(ParseS3Url("s3://evil.com:80@x/k").ok());
  EXPECT_FALSE(ParseS3Url("s3://a?b/k").ok());
}

TEST(S3Wire, EncodesAsSignatureVersion4Expects) {
  EXPECT_EQ(UriEncode("a/b c+d~_.-", true), "a/b%20c%2Bd~_.-");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", true), "%C3%A9");
}

TEST(S3Wire, ParsesAListingPage) {
  const std::string xml =
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Name>b</Name><Prefix>run/</Prefix><IsTruncated>true</IsTruncated>"
      "<Contents><Key>run/a&amp;b</Key><Size>3</Size></Contents><Contents><Key>run/c</Key></Contents>"
      "<CommonPrefixes><Prefix>run/step-1/</Prefix></CommonPrefixes>"
      "<NextContinuationToken>tok/+=</NextContinuationToken></ListBucketResult>";
  ListPage page = ParseListPage(xml);
  EXPECT_EQ(page.keys, (std::vector<std::string>{"run/a&b", "run/c"}));
  EXPECT_EQ(page.prefixes, (std::vector<std::string>{"run/step-1/"}));
  EXPECT_EQ(page.next_token, "tok/+=");
  EXPECT_EQ(ParseListPage("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>").next_token, "");
}

TEST(S3Wire, ParsesErrorsAndEntities) {
  S3ErrorBody e = ParseErrorBody(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The key &lt;x&gt; &#233;&#x41;</Message>"
      "<RequestId>42</RequestId></Error>");
  EXPECT_EQ(e.code, "NoSuchKey");
  EXPECT_EQ(e.message,
            "The key <x> \xc3\xa9"
            "A");
  EXPECT_EQ(e.request_id, "42");
  EXPECT_EQ(ParseErrorBody("not xml").code, "");
  EXPECT_EQ(XmlElements("<A/><A>x</A><AB>y</AB>", "A"), (std::vector<std::string>{"", "x"}));
  // Truncated or hostile documents give what they hold, never a crash.
  EXPECT_EQ(XmlElements("<A>x", "A"), std::vector<std::string>{});
  EXPECT_EQ(XmlElement("<A>&#x110000;&bogus;&</A>", "A"), "\xef\xbf\xbd&bogus;&");
}

TEST(S3Wire, CompletesWithThePartsInOrder) {
  EXPECT_EQ(CompleteMultipartBody({"\"e1\"", "\"e2\""}),
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part></CompleteMultipartUpload>");
}

GetEnv EnvOf(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(S3Config, ReadsWhatTheAwsCliReads) {
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config c, ResolveS3Config({}, EnvOf({{"AWS_ACCESS_KEY_ID", "id"},
                                                                    {"AWS_SECRET_ACCESS_KEY", "secret"},
                                                                    {"AWS_SESSION_TOKEN", "tok"},
                                                                    {"AWS_DEFAULT_REGION", "eu-west-1"},
                                                                    {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}})));
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(c.addressing, Addressing::kPath);  // a custom endpoint: path style
  EXPECT_EQ(ObjectUrl(c, "b", "run/x y"), "http://127.0.0.1:9000/b/run/x%20y");

  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config aws, ResolveS3Config({}, EnvOf({{"AWS_REGION", "us-west-2"},
                                                                      {"AWS_DEFAULT_REGION", "x"},
                                                                      {"AWS_ENDPOINT_URL", "http://other"},
                                                                      {"AWS_ENDPOINT_URL_S3", "https://s3.example"}})));
  EXPECT_EQ(aws.region, "us-west-2");  // AWS_REGION first, as the CLI
  EXPECT_EQ(aws.endpoint, "https://s3.example");
  EXPECT_EQ(aws.access_key_id, "");  // unsigned

  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config def, ResolveS3Config({}, EnvOf({})));
  EXPECT_EQ(def.endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(def.addressing, Addressing::kVirtual);
  EXPECT_EQ(ObjectUrl(def, "b", "k"), "https://b.s3.us-east-1.amazonaws.com/k");
  EXPECT_EQ(ObjectUrl(def, "a.b", "k"), "https://s3.us-east-1.amazonaws.com/a.b/k");  // dots: path style
  EXPECT_EQ(def.max_attempts, kDefaultMaxAttempts);

  S3Config given;
  given.access_key_id = "only-id";
  EXPECT_TRUE(StatusIs(ResolveS3Config(given, EnvOf({})).status(), StatusCode::kInvalidArgument, {"AWS_SECRET"}));
  given = {};
  given.endpoint = "ftp://x";
  EXPECT_TRUE(StatusIs(ResolveS3Config(given, EnvOf({})).status(), StatusCode::kInvalidArgument, {"ftp://x"}));
  given = {};
  given.part_size = 1 << 20;
  EXPECT_TRUE(StatusIs(ResolveS3Config(given, EnvOf({})).status(), StatusCode::kInvalidArgument, {"5 MiB"}));
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(S3Config, ReadsTheProfileAsTheAwsCliDoes) {
  const std::string home = testing_util::MakeTempDir("s3-profile-");
  ASSERT_EQ(::mkdir((home + "/.aws").c_str(), 0700), 0);
  WriteText(home + "/.aws/credentials",
            "# comment\n[default]\naws_access_key_id = DEFAULTID\naws_secret_access_key = defaultsecret\n\n"
            "[train]\nAWS_ACCESS_KEY_ID=TRAINID\naws_secret_access_key=trainsecret\naws_session_token = tok\n");
  WriteText(home + "/.aws/config",
            "[default]\nregion = eu-central-1\n[profile train]\nregion = ap-south-1\n"
            "endpoint_url = http://minio:9000\ns3 =\n  addressing_style = virtual\n");
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config d, ResolveS3Config({}, EnvOf({{"HOME", home}})));
  EXPECT_EQ(d.access_key_id, "DEFAULTID");
  EXPECT_EQ(d.secret_access_key, "defaultsecret");
  EXPECT_EQ(d.region, "eu-central-1");
  EXPECT_EQ(d.endpoint, "https://s3.eu-central-1.amazonaws.com");
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config t, ResolveS3Config({}, EnvOf({{"HOME", home}, {"AWS_PROFILE", "train"}})));
  EXPECT_EQ(t.access_key_id, "TRAINID");
  EXPECT_EQ(t.session_token, "tok");
  EXPECT_EQ(t.region, "ap-south-1");
  EXPECT_EQ(t.endpoint, "http://minio:9000");
  EXPECT_EQ(t.addressing, Addressing::kPath);
  // The environment comes first, the options before it.
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config e, ResolveS3Config({}, EnvOf({{"HOME", home},
                                                                    {"AWS_ACCESS_KEY_ID", "ENVID"},
                                                                    {"AWS_SECRET_ACCESS_KEY", "envsecret"},
                                                                    {"AWS_REGION", "us-west-1"}})));
  EXPECT_EQ(e.access_key_id, "ENVID");
  EXPECT_EQ(e.region, "us-west-1");
  S3Config given;
  given.region = "sa-east-1";
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config o, ResolveS3Config(given, EnvOf({{"HOME", home}, {"AWS_REGION", "x"}})));
  EXPECT_EQ(o.region, "sa-east-1");
  // Files named by the environment; a profile nobody has is an error naming it.
  WriteText(home + "/creds", "[other]\naws_access_key_id=O\naws_secret_access_key=o\n");
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config f, ResolveS3Config({}, EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", home + "/creds"},
                                                                    {"AWS_CONFIG_FILE", home + "/none"},
                                                                    {"AWS_PROFILE", "other"}})));
  EXPECT_EQ(f.access_key_id, "O");
  EXPECT_TRUE(StatusIs(ResolveS3Config({}, EnvOf({{"HOME", home}, {"AWS_PROFILE", "nosuch"}})).status(),
                       StatusCode::kInvalidArgument, {"'nosuch'", home + "/.aws/credentials"}));
  // No files at all: nothing from them.
  DCKPT_ASSERT_OK_AND_ASSIGN(S3Config none, ResolveS3Config({}, EnvOf({{"HOME", home + "/nothing"}})));
  EXPECT_EQ(none.access_key_id, "");
}

}  // namespace
}  // namespace s3
}  // namespace distckpt
