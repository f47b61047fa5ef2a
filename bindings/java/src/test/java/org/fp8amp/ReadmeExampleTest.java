package org.fp8amp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/**
 * bindings/java/README.md's example is bindings/java/examples/Example.java, verbatim, and prints
 * what the README says it prints (the test jar holds the compiled example; ctest passes the paths).
 */
class ReadmeExampleTest {
    @Test
    void theReadmeExampleIsTheExampleFileAndPrintsWhatItSays() throws Exception {
        String readmePath = System.getProperty("fp8amp.java.readme");
        String examplePath = System.getProperty("fp8amp.java.example");
        assumeTrue(readmePath != null && examplePath != null, "run by ctest (java.junit), which passes the paths");
        String readme = Files.readString(Path.of(readmePath));
        String example = Files.readString(Path.of(examplePath));
        assertTrue(readme.contains("```java\n" + example + "```\n"), "README.md's example differs from " + examplePath);

        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        PrintStream saved = System.out;
        System.setOut(new PrintStream(captured, true, StandardCharsets.UTF_8));
        try {
            Class.forName("Example").getMethod("main", String[].class).invoke(null, (Object) new String[0]);
        } finally {
            System.setOut(saved);
        }
        String printed = captured.toString(StandardCharsets.UTF_8);
        assertEquals(3, printed.lines().count(), printed);
        assertTrue(readme.contains("It prints\n\n```\n" + printed + "```\n"), "README.md's output differs from:\n" + printed);
    }
}
